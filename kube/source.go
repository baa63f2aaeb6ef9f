package kube

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// ServiceHandler receives Services and EndpointSlices: old nil on add,
// new nil on delete. OnSynced follows the initial state.
type ServiceHandler interface {
	OnService(old, new *corev1.Service)
	OnEndpointSlice(old, new *discoveryv1.EndpointSlice)
	OnSynced()
}

// WatchServices feeds h from informers until ctx ends.
func WatchServices(ctx context.Context, c kubernetes.Interface, h ServiceHandler) error {
	f := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithTransform(dropBookkeeping))
	svc := f.Core().V1().Services().Informer()
	eps := f.Discovery().V1().EndpointSlices().Informer()
	if _, err := svc.AddEventHandler(handlerFuncs(h.OnService)); err != nil {
		return err
	}
	if _, err := eps.AddEventHandler(handlerFuncs(h.OnEndpointSlice)); err != nil {
		return err
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), svc.HasSynced, eps.HasSynced) {
		return ctx.Err()
	}
	h.OnSynced()
	<-ctx.Done()
	return nil
}

// handlerFuncs adapts a typed (old, new) callback to informer events.
func handlerFuncs[T any](on func(old, new *T)) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) {
			if n, ok := o.(*T); ok {
				on(nil, n)
			}
		},
		UpdateFunc: func(o, n any) {
			oo, ok1 := o.(*T)
			nn, ok2 := n.(*T)
			if ok1 && ok2 {
				on(oo, nn)
			}
		},
		DeleteFunc: func(o any) {
			if d, ok := unwrap(o).(*T); ok {
				on(d, nil)
			}
		},
	}
}

// dropBookkeeping removes what no weft consumer of Services and
// EndpointSlices reads (managed fields, annotations such as kubectl's
// last-applied configuration) before the object enters the cache: at 10k
// Services it is most of the cached bytes.
func dropBookkeeping(o any) (any, error) {
	if m, ok := o.(metav1.Object); ok {
		m.SetManagedFields(nil)
		m.SetAnnotations(nil)
	}
	return o, nil
}

func unwrap(o any) any {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		return d.Obj
	}
	return o
}

// pollInterval is how often the manifest directory is checked for changes.
const pollInterval = 500 * time.Millisecond

func newTicker() *time.Ticker { return time.NewTicker(pollInterval) }
