package kube

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/weftnet/weft/internal/testutil"
)

// TestWatchServicesSlims: Services and EndpointSlices reach the handler
// (and the informer cache) without managed fields and annotations, and with
// everything the proxy and DNS read.
func TestWatchServicesSlims(t *testing.T) {
	meta := metav1.ObjectMeta{Namespace: "default", Name: "web",
		Annotations:   map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{...}"},
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}}}
	svc := &corev1.Service{ObjectMeta: meta, Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10"}}
	esMeta := *meta.DeepCopy()
	esMeta.Name, esMeta.Labels = "web-1", map[string]string{discoveryv1.LabelServiceName: "web"}
	es := &discoveryv1.EndpointSlice{ObjectMeta: esMeta, AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.1.2"}}}}
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
		if len(m.GetManagedFields()) > 0 || len(m.GetAnnotations()) > 0 {
			t.Errorf("%s kept managed fields %v or annotations %v", m.GetName(), m.GetManagedFields(), m.GetAnnotations())
		}
	}
	if gotSvc.Spec.ClusterIP != "10.96.0.10" || gotES.Labels[discoveryv1.LabelServiceName] != "web" || len(gotES.Endpoints) != 1 {
		t.Errorf("slimmed too much: %+v %+v", gotSvc.Spec, gotES)
	}
}
