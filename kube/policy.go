package kube

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
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
	pods, err := addHandler(f.Core().V1().Pods().Informer(), h.OnPolicyPod)
	if err != nil {
		return fmt.Errorf("watching pods: %w", err)
	}
	nss, err := addHandler(f.Core().V1().Namespaces().Informer(), h.OnNamespace)
	if err != nil {
		return fmt.Errorf("watching namespaces: %w", err)
	}
	pols, err := addHandler(f.Networking().V1().NetworkPolicies().Informer(), h.OnNetworkPolicy)
	if err != nil {
		return fmt.Errorf("watching networkpolicies: %w", err)
	}
	return run(ctx, f, h.OnPolicySynced, pods, nss, pols)
}
