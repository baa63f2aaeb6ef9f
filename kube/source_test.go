package kube

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/weftnet/weft/internal/testutil"
)

// TestWatchServicesSlims: Services and EndpointSlices reach the handler
// (and the informer cache) without managed fields, annotations and the
// endpoints' targetRef and deprecatedTopology, and with everything the
// proxy and DNS read, which includes a slice's last-change-trigger-time
// (network programming latency) and an endpoint's hostname, node, zone
// and hints.
func TestWatchServicesSlims(t *testing.T) {
	const trigger = "2026-11-23T09:00:00.123456789Z"
	meta := metav1.ObjectMeta{Namespace: "default", Name: "web",
		Annotations: map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{...}",
			corev1.EndpointsLastChangeTriggerTime: trigger},
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}}}
	svc := &corev1.Service{ObjectMeta: meta, Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10"}}
	esMeta := *meta.DeepCopy()
	esMeta.Name, esMeta.Labels = "web-1", map[string]string{discoveryv1.LabelServiceName: "web"}
	es := &discoveryv1.EndpointSlice{ObjectMeta: esMeta, AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.1.2"}, Hostname: ptr("web-0"), NodeName: ptr("n1"), Zone: ptr("z1"),
			Hints:              &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z1"}}},
			TargetRef:          &corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "web-0", UID: "6f1c2c1e-0000-4000-8000-000000000001"},
			DeprecatedTopology: map[string]string{"kubernetes.io/hostname": "n1"}}}}
	r := &recorder{services: map[string]*corev1.Service{}, slices: map[string]*discoveryv1.EndpointSlice{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = WatchServices(ctx, fake.NewClientset(svc, es), r) }()
	testutil.Eventually(t, 5*time.Second, "the initial sync", func() bool { r.Lock(); defer r.Unlock(); return r.synced })
	r.Lock()
	defer r.Unlock()
	gotSvc, gotES := r.services["default/web"], r.slices["default/web-1"]
	if gotSvc == nil || gotES == nil {
		t.Fatalf("handler got service %v, slice %v", gotSvc, gotES)
	}
	for _, m := range []metav1.Object{gotSvc, gotES} {
		if len(m.GetManagedFields()) > 0 {
			t.Errorf("%s kept managed fields %v", m.GetName(), m.GetManagedFields())
		}
	}
	if a := gotSvc.GetAnnotations(); len(a) > 0 {
		t.Errorf("the Service kept annotations %v", a)
	}
	if a := gotES.GetAnnotations(); len(a) != 1 || a[corev1.EndpointsLastChangeTriggerTime] != trigger {
		t.Errorf("the EndpointSlice kept annotations %v, want only %s", a, corev1.EndpointsLastChangeTriggerTime)
	}
	if gotSvc.Spec.ClusterIP != "10.96.0.10" || gotES.Labels[discoveryv1.LabelServiceName] != "web" || len(gotES.Endpoints) != 1 {
		t.Fatalf("slimmed too much: %+v %+v", gotSvc.Spec, gotES)
	}
	if e := gotES.Endpoints[0]; e.TargetRef != nil || e.DeprecatedTopology != nil {
		t.Errorf("the endpoint kept targetRef %v, deprecatedTopology %v", e.TargetRef, e.DeprecatedTopology)
	}
	if e := gotES.Endpoints[0]; *e.Hostname != "web-0" || *e.NodeName != "n1" || *e.Zone != "z1" || e.Hints == nil || e.Hints.ForZones[0].Name != "z1" {
		t.Errorf("slimmed the endpoint too much: %+v", e)
	}
}

func ptr[T any](v T) *T { return &v }

// slowHandler is a ServiceHandler whose first Service event blocks until
// release is closed, and which records what it had received when OnSynced
// came.
type slowHandler struct {
	recorder
	release      chan struct{}
	first        sync.Once
	syncedWith   [2]int // Services and EndpointSlices received before OnSynced
	syncedCalled bool
}

func (h *slowHandler) OnService(old, new *corev1.Service) {
	h.first.Do(func() { <-h.release })
	h.recorder.OnService(old, new)
}

func (h *slowHandler) OnSynced() {
	h.Lock()
	defer h.Unlock()
	h.syncedCalled = true
	h.syncedWith = [2]int{len(h.services), len(h.slices)}
}

// TestWatchServicesSyncedAfterHandler: OnSynced comes only once the handler
// has received every object of the initial lists, however far behind the
// informers' caches it is. (The proxy's first sync follows OnSynced: were
// it told earlier, a restarted proxy would program a partial view and cut
// live Services.) The test runs in a synctest bubble, whose clock moves
// only when every goroutine is blocked, so the outcome does not depend on
// timing.
func TestWatchServicesSyncedAfterHandler(t *testing.T) {
	const n = 50
	var objs []runtime.Object
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		objs = append(objs,
			&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}},
			&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name + "-1",
				Labels: map[string]string{discoveryv1.LabelServiceName: name}}, AddressType: discoveryv1.AddressTypeIPv4})
	}
	synctest.Test(t, func(t *testing.T) {
		h := &slowHandler{recorder: recorder{services: map[string]*corev1.Service{}, slices: map[string]*discoveryv1.EndpointSlice{}},
			release: make(chan struct{})}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- WatchServices(ctx, fake.NewClientset(objs...), h) }()

		// A minute of the bubble's clock passes once every goroutine is
		// blocked: the caches are full, the handler is stuck on its first
		// Service, and any poll for the caches' sync has fired.
		time.Sleep(time.Minute)
		synctest.Wait()
		h.Lock()
		early, with := h.syncedCalled, h.syncedWith
		h.Unlock()
		if early {
			t.Errorf("OnSynced came while the handler had received %d of %d Services and %d of %d EndpointSlices", with[0], n, with[1], n)
		}
		close(h.release)
		time.Sleep(time.Minute)
		synctest.Wait()
		h.Lock()
		called, with := h.syncedCalled, h.syncedWith
		h.Unlock()
		if !called || with != [2]int{n, n} {
			t.Errorf("OnSynced called %v with %v Services and EndpointSlices received, want %d of each", called, with, n)
		}
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Error(err)
		}
	})
}
