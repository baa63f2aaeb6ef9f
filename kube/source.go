package kube

import (
	"context"
	"fmt"
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

// WatchServices feeds h from informers until ctx ends. OnSynced comes
// once h has received every Service and EndpointSlice of the initial lists.
func WatchServices(ctx context.Context, c kubernetes.Interface, h ServiceHandler) error {
	f := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithTransform(dropBookkeeping))
	svc, err := addHandler(f.Core().V1().Services().Informer(), h.OnService)
	if err != nil {
		return fmt.Errorf("watching services: %w", err)
	}
	eps, err := addHandler(f.Discovery().V1().EndpointSlices().Informer(), h.OnEndpointSlice)
	if err != nil {
		return fmt.Errorf("watching endpointslices: %w", err)
	}
	return run(ctx, f, h.OnSynced, svc, eps)
}

// addHandler sends inf's events to on. The returned checker is done once
// on has received every object of the informer's initial list: the
// informer's own HasSynced only says that its cache holds them, and the
// handler may then still be far behind (its events wait in an unbounded
// buffer), so a consumer told "synced" by the informer would act on a
// partial view.
func addHandler[T any](inf cache.SharedIndexInformer, on func(old, new *T)) (cache.DoneChecker, error) {
	reg, err := inf.AddEventHandler(handlerFuncs(on))
	if err != nil {
		return nil, err
	}
	return reg.HasSyncedChecker(), nil
}

// run starts f's informers, calls synced (if not nil) once every handler
// has received its initial list, and returns when ctx ends, after the
// informers stopped.
func run(ctx context.Context, f informers.SharedInformerFactory, synced func(), handlers ...cache.DoneChecker) error {
	f.Start(ctx.Done())
	defer f.Shutdown()
	for _, h := range handlers {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-h.Done():
		}
	}
	if synced != nil {
		synced()
	}
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
// last-applied configuration, each endpoint's targetRef and
// deprecatedTopology) before the object enters the cache: at 10k Services
// it is most of the cached bytes, and a targetRef (kind, namespace, name,
// uid) is about 250 bytes an endpoint, 250 MB at a million. An
// EndpointSlice keeps its endpoints.kubernetes.io/last-change-trigger-time
// annotation, from which the proxy measures network programming latency
// as kube-proxy does. The manifest source applies it too.
func dropBookkeeping(o any) (any, error) {
	m, ok := o.(metav1.Object)
	if !ok {
		return o, nil
	}
	m.SetManagedFields(nil)
	keep := ""
	if es, isSlice := o.(*discoveryv1.EndpointSlice); isSlice {
		keep = m.GetAnnotations()[corev1.EndpointsLastChangeTriggerTime]
		for i := range es.Endpoints {
			es.Endpoints[i].TargetRef = nil
			es.Endpoints[i].DeprecatedTopology = nil
		}
	}
	if keep != "" {
		m.SetAnnotations(map[string]string{corev1.EndpointsLastChangeTriggerTime: keep})
	} else {
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
