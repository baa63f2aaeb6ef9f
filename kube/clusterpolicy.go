package kube

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	cnpclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"
	cnpinformers "sigs.k8s.io/network-policy-api/pkg/client/informers/externalversions"
)

// ClusterPolicyHandler receives what ClusterNetworkPolicy enforcement
// reads besides the PolicyHandler's objects: the ClusterNetworkPolicies
// (policy.networking.k8s.io/v1beta1) and the Nodes their nodes peers
// select (names, labels and addresses only). old is nil on add, new nil
// on delete. OnClusterPoliciesSynced follows the initial state.
type ClusterPolicyHandler interface {
	OnClusterNetworkPolicy(old, new *cnpv1beta1.ClusterNetworkPolicy)
	OnPolicyNode(old, new *corev1.Node)
	OnClusterPoliciesSynced()
}

// ClusterPolicyGroupVersion is the API weft reads ClusterNetworkPolicies
// from (its storage version; v1alpha2, also served, is the same shape).
const ClusterPolicyGroupVersion = "policy.networking.k8s.io/v1beta1"

// ClusterPoliciesServed reports whether the API server serves
// ClusterNetworkPolicies (their CRD is installed).
func ClusterPoliciesServed(c kubernetes.Interface) (bool, error) {
	list, err := c.Discovery().ServerResourcesForGroupVersion(ClusterPolicyGroupVersion)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("discovering %s: %w", ClusterPolicyGroupVersion, err)
	}
	for _, r := range list.APIResources {
		if r.Name == "clusternetworkpolicies" {
			return true, nil
		}
	}
	return false, nil
}

// WatchClusterPolicies feeds h from informers until ctx ends.
func WatchClusterPolicies(ctx context.Context, c kubernetes.Interface, cc cnpclient.Interface, h ClusterPolicyHandler) error {
	core := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithTransform(slimNode))
	nodes, err := addHandler(core.Core().V1().Nodes().Informer(), h.OnPolicyNode)
	if err != nil {
		return fmt.Errorf("watching nodes: %w", err)
	}
	f := cnpinformers.NewSharedInformerFactory(cc, 0)
	pols, err := addHandler(f.Policy().V1beta1().ClusterNetworkPolicies().Informer(), h.OnClusterNetworkPolicy)
	if err != nil {
		return fmt.Errorf("watching clusternetworkpolicies: %w", err)
	}
	f.Start(ctx.Done())
	defer f.Shutdown()
	return run(ctx, core, h.OnClusterPoliciesSynced, []cache.DoneChecker{nodes, pols}...)
}

// slimNode keeps what nodes peers select by.
func slimNode(o any) (any, error) {
	n, ok := o.(*corev1.Node)
	if !ok {
		return o, nil
	}
	return &corev1.Node{TypeMeta: n.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion, Labels: n.Labels},
		Status:     corev1.NodeStatus{Addresses: n.Status.Addresses}}, nil
}
