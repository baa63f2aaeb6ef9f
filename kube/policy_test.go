package kube

import (
	"context"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/weftnet/weft/internal/testutil"
)

type policyRecorder struct {
	sync.Mutex
	pods, nss, pols map[string]string // key -> a label value, "" once deleted
	synced          bool
}

func (r *policyRecorder) OnPolicyPod(old, new *corev1.Pod) {
	r.Lock()
	defer r.Unlock()
	if new == nil {
		r.pods[old.Namespace+"/"+old.Name] = "deleted"
		return
	}
	if new.Spec.Containers[0].Ports[0].Name != "http" || new.Spec.Containers[0].Image != "" {
		panic("pod not slimmed to what policies read")
	}
	r.pods[new.Namespace+"/"+new.Name] = new.Labels["app"]
}

func (r *policyRecorder) OnNamespace(old, new *corev1.Namespace) {
	r.Lock()
	defer r.Unlock()
	if new == nil {
		r.nss[old.Name] = "deleted"
		return
	}
	r.nss[new.Name] = new.Labels["team"]
}

func (r *policyRecorder) OnNetworkPolicy(old, new *networkingv1.NetworkPolicy) {
	r.Lock()
	defer r.Unlock()
	if new == nil {
		r.pols[old.Namespace+"/"+old.Name] = "deleted"
		return
	}
	r.pols[new.Namespace+"/"+new.Name] = "present"
}

func (r *policyRecorder) OnPolicySynced() { r.Lock(); r.synced = true; r.Unlock() }

// waitFor polls ok under the recorder's lock.
func (r *policyRecorder) waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, what, func() bool { r.Lock(); defer r.Unlock(); return ok() })
}

func TestWatchPolicies(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "a", Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "img", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 80}}}}}}
	c := fake.NewClientset(pod,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "x", Labels: map[string]string{"team": "blue"}}},
		&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "deny"}})
	r := &policyRecorder{pods: map[string]string{}, nss: map[string]string{}, pols: map[string]string{}}
	go func() { _ = WatchPolicies(ctx, c, r) }()
	r.waitFor(t, "the initial state", func() bool {
		return r.synced && r.pods["x/a"] == "web" && r.nss["x"] == "blue" && r.pols["x/deny"] == "present"
	})
	pod = pod.DeepCopy()
	pod.Labels["app"] = "db"
	if _, err := c.CoreV1().Pods("x").Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.NetworkingV1().NetworkPolicies("x").Delete(ctx, "deny", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, "the relabel and the deletion", func() bool { return r.pods["x/a"] == "db" && r.pols["x/deny"] == "deleted" })
}
