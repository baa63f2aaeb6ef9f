package kube

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// PolicyHandler receives what NetworkPolicy enforcement reads: Pods,
// Namespaces (their labels) and NetworkPolicies, cluster-wide. old is nil
// on add, new nil on delete. OnPolicySynced follows the initial state.
type PolicyHandler interface {
	OnPolicyPod(old, new *corev1.Pod)
	OnNamespace(old, new *corev1.Namespace)
	OnNetworkPolicy(old, new *networkingv1.NetworkPolicy)
	OnPolicySynced()
}

// WatchPolicies feeds h from informers until ctx ends.
func WatchPolicies(ctx context.Context, c kubernetes.Interface, h PolicyHandler) error {
	f := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithTransform(slimPolicyObject))
	pods := f.Core().V1().Pods().Informer()
	nss := f.Core().V1().Namespaces().Informer()
	pols := f.Networking().V1().NetworkPolicies().Informer()
	if _, err := pods.AddEventHandler(handlerFuncs(h.OnPolicyPod)); err != nil {
		return err
	}
	if _, err := nss.AddEventHandler(handlerFuncs(h.OnNamespace)); err != nil {
		return err
	}
	if _, err := pols.AddEventHandler(handlerFuncs(h.OnNetworkPolicy)); err != nil {
		return err
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), pods.HasSynced, nss.HasSynced, pols.HasSynced) {
		return ctx.Err()
	}
	h.OnPolicySynced()
	<-ctx.Done()
	f.Shutdown()
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

// slimPolicyObject keeps of a Pod only what policies read (identity,
// labels, node, host networking, named container ports, phase, addresses).
func slimPolicyObject(o any) (any, error) {
	p, ok := o.(*corev1.Pod)
	if !ok {
		return o, nil
	}
	out := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID,
		Labels: p.Labels, ResourceVersion: p.ResourceVersion}}
	out.Spec.NodeName = p.Spec.NodeName
	out.Spec.HostNetwork = p.Spec.HostNetwork
	for _, c := range p.Spec.Containers {
		out.Spec.Containers = append(out.Spec.Containers, corev1.Container{Name: c.Name, Ports: c.Ports})
	}
	out.Status.Phase = p.Status.Phase
	out.Status.PodIP = p.Status.PodIP
	out.Status.PodIPs = p.Status.PodIPs
	return out, nil
}
