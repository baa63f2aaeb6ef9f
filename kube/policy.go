package kube

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
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
	f := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithTransform(slimPod))
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
