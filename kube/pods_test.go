package kube

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/weftnet/weft/internal/testutil"
)

const podYAML = `apiVersion: v1
kind: Pod
metadata: {name: db-0, namespace: data}
spec:
  hostname: db-0
  subdomain: db
  containers: [{name: c, image: x}]
status:
  phase: Running
  podIP: 10.244.1.7
  podIPs: [{ip: 10.244.1.7}]
`

// podRecorder also implements PodHandler.
type podRecorder struct {
	recorder
	pods map[string]*corev1.Pod
}

func (r *podRecorder) OnPod(old, new *corev1.Pod) {
	r.Lock()
	defer r.Unlock()
	if new == nil {
		delete(r.pods, old.Namespace+"/"+old.Name)
		return
	}
	r.pods[new.Namespace+"/"+new.Name] = new
}

func (r *podRecorder) podIP(key string) string {
	r.Lock()
	defer r.Unlock()
	if p := r.pods[key]; p != nil {
		return p.Status.PodIP
	}
	return ""
}

// TestManifestPods: Pods in manifest files reach a PodHandler (updates and
// removal too); a handler that is only a ServiceHandler is not bothered.
func TestManifestPods(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "all.yaml")
	if err := os.WriteFile(file, []byte(goodYAML+"---\n"+podYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rec := &podRecorder{recorder: recorder{services: map[string]*corev1.Service{}, slices: map[string]*discoveryv1.EndpointSlice{}}, pods: map[string]*corev1.Pod{}}
	plain := &recorder{services: map[string]*corev1.Service{}, slices: map[string]*discoveryv1.EndpointSlice{}}
	go func() { _ = WatchManifests(ctx, dir, rec, log) }()
	go func() { _ = WatchManifests(ctx, dir, plain, log) }()
	testutil.Eventually(t, 5*time.Second, "the pod", func() bool { return rec.podIP("data/db-0") == "10.244.1.7" && rec.clusterIP("default/web") != "" })
	testutil.Eventually(t, 5*time.Second, "the plain handler's service", func() bool { return plain.clusterIP("default/web") != "" })
	rec.Lock()
	if p := rec.pods["data/db-0"]; p.Spec.Hostname != "db-0" || p.Spec.Subdomain != "db" {
		t.Errorf("pod fields lost: %+v", p.Spec)
	}
	rec.Unlock()
	if err := os.WriteFile(file, []byte(goodYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, "pod removal", func() bool { return rec.podIP("data/db-0") == "" })
}

// TestSlimPod keeps what DNS reads and drops the rest.
func TestSlimPod(t *testing.T) {
	p := &corev1.Pod{}
	p.Name, p.Namespace = "a", "b"
	p.Annotations = map[string]string{"big": "x"}
	p.Spec.Hostname, p.Spec.Subdomain = "h", "s"
	p.Spec.Containers = []corev1.Container{{Name: "c"}}
	p.Status.PodIPs = []corev1.PodIP{{IP: "10.244.0.5"}}
	p.Status.Phase = corev1.PodRunning
	o, err := slimPod(p)
	if err != nil {
		t.Fatal(err)
	}
	s := o.(*corev1.Pod)
	if s.Name != "a" || s.Namespace != "b" || s.Spec.Hostname != "h" || s.Spec.Subdomain != "s" ||
		len(s.Status.PodIPs) != 1 || s.Status.Phase != corev1.PodRunning {
		t.Errorf("slim pod lost fields: %+v", s)
	}
	if s.Annotations != nil || s.Spec.Containers != nil {
		t.Errorf("slim pod kept annotations or containers")
	}
}
