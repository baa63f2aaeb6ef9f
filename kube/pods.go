package kube

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
)

// PodHandler receives Pods: old nil on add, new nil on delete. A handler
// given to WatchManifests that also implements PodHandler receives the Pods
// found in manifest files.
type PodHandler interface {
	OnPod(old, new *corev1.Pod)
}

// WatchPods feeds h from a Pod informer until ctx ends, calling synced once
// the initial list has been delivered. The informer keeps only what
// consumers read (names, hostname, subdomain, addresses, phase,
// conditions), so a large cluster's pods cost little memory.
func WatchPods(ctx context.Context, c kubernetes.Interface, h PodHandler, synced func()) error {
	f := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithTransform(slimPod))
	pods, err := addHandler(f.Core().V1().Pods().Informer(), h.OnPod)
	if err != nil {
		return fmt.Errorf("watching pods: %w", err)
	}
	return run(ctx, f, synced, pods)
}

// slimPod keeps of a Pod what weft's consumers read (DNS: names,
// hostname, subdomain, readiness, addresses; NetworkPolicy: labels, node,
// host networking, named container ports, phase, addresses), so that a
// large cluster's pods cost little memory.
func slimPod(o any) (any, error) {
	p, ok := o.(*corev1.Pod)
	if !ok {
		return o, nil
	}
	out := &corev1.Pod{
		TypeMeta: p.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
			Labels: p.Labels, DeletionTimestamp: p.DeletionTimestamp,
		},
		Spec: corev1.PodSpec{Hostname: p.Spec.Hostname, Subdomain: p.Spec.Subdomain, NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork},
		Status: corev1.PodStatus{
			Phase: p.Status.Phase, Conditions: p.Status.Conditions, PodIP: p.Status.PodIP, PodIPs: p.Status.PodIPs,
		},
	}
	for _, c := range p.Spec.Containers {
		if len(c.Ports) > 0 {
			out.Spec.Containers = append(out.Spec.Containers, corev1.Container{Name: c.Name, Ports: c.Ports})
		}
	}
	return out, nil
}
