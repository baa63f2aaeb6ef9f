package kube

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/weftnet/weft/internal/testutil"
)

const goodYAML = `# two objects in one file
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: [{addresses: [10.244.1.2], targetRef: {kind: Pod, name: web-0}}]
`

func TestParseManifests(t *testing.T) {
	objs, err := ParseManifests("good.yaml", []byte(goodYAML))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := objs["Service/default/web"]; !ok || len(objs) != 2 {
		t.Fatalf("objects: %v", objs)
	}
	if _, ok := objs["EndpointSlice/default/web-1"]; !ok {
		t.Fatalf("slice without namespace not defaulted: %v", objs)
	}
	list := `{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Service","metadata":{"name":"a","namespace":"x"},"spec":{"clusterIP":"10.96.0.20","ports":[{"port":53,"protocol":"UDP"}]}}]}`
	if objs, err := ParseManifests("list.json", []byte(list)); err != nil || objs["Service/x/a"] == nil {
		t.Fatalf("JSON list: %v %v", objs, err)
	}
	for name, tc := range map[string]struct{ text, want string }{
		"broken yaml in the second document": {goodYAML + "---\napiVersion: v1\nkind: Service\nmetadata: {name: x\n", "bad.yaml:15 (document 3)"},
		"unknown kind":                       {"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n", "bad.yaml:1 (document 1)"},
		"unregistered kind":                  {"apiVersion: v1\nkind: Nope\n", "bad.yaml:1"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ParseManifests("bad.yaml", []byte(tc.text))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
}

// recorder is a ServiceHandler that keeps the current objects.
type recorder struct {
	sync.Mutex
	services map[string]*corev1.Service
	slices   map[string]*discoveryv1.EndpointSlice
	synced   bool
}

func (r *recorder) OnService(old, new *corev1.Service) {
	r.Lock()
	defer r.Unlock()
	if new == nil {
		delete(r.services, old.Namespace+"/"+old.Name)
		return
	}
	r.services[new.Namespace+"/"+new.Name] = new
}

func (r *recorder) OnEndpointSlice(old, new *discoveryv1.EndpointSlice) {
	r.Lock()
	defer r.Unlock()
	if new == nil {
		delete(r.slices, old.Namespace+"/"+old.Name)
		return
	}
	r.slices[new.Namespace+"/"+new.Name] = new
}

func (r *recorder) OnSynced() { r.Lock(); r.synced = true; r.Unlock() }

func (r *recorder) clusterIP(key string) string {
	r.Lock()
	defer r.Unlock()
	if s := r.services[key]; s != nil {
		return s.Spec.ClusterIP
	}
	return ""
}

// TestWatchManifests: changes are picked up, a broken file keeps its last
// good objects, a removed file removes its objects; objects are slimmed as
// the informers' are.
func TestWatchManifests(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "web.yaml")
	write := func(text string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(goodYAML)
	rec := &recorder{services: map[string]*corev1.Service{}, slices: map[string]*discoveryv1.EndpointSlice{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = WatchManifests(ctx, dir, rec, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	testutil.Eventually(t, 5*time.Second, "initial load", func() bool { return rec.clusterIP("default/web") == "10.96.0.10" && rec.synced })
	rec.Lock()
	if es := rec.slices["default/web-1"]; es == nil || len(es.Endpoints) != 1 || es.Endpoints[0].TargetRef != nil {
		t.Errorf("slice as the handler got it: %+v, want one endpoint without targetRef", es)
	}
	rec.Unlock()

	write(strings.Replace(goodYAML, "10.96.0.10", "10.96.0.11", 1))
	testutil.Eventually(t, 5*time.Second, "update", func() bool { return rec.clusterIP("default/web") == "10.96.0.11" })

	write(goodYAML + "---\nkind: [broken\n")
	// A second file, written after the broken one and sorting after it: a
	// scan reads files in name order, so once the marker is seen the broken
	// file has been read (and rejected) too.
	marker := strings.NewReplacer("name: web,", "name: marker,", "name: web-1,", "name: marker-1,").Replace(goodYAML)
	if err := os.WriteFile(filepath.Join(dir, "z-marker.yaml"), []byte(marker), 0o644); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, "the marker file", func() bool { return rec.clusterIP("default/marker") != "" })
	if got := rec.clusterIP("default/web"); got != "10.96.0.11" {
		t.Fatalf("a broken file changed the state: clusterIP %q", got)
	}

	for _, f := range []string{file, filepath.Join(dir, "z-marker.yaml")} {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 5*time.Second, "removal", func() bool {
		rec.Lock()
		defer rec.Unlock()
		return len(rec.services) == 0 && len(rec.slices) == 0
	})
}
