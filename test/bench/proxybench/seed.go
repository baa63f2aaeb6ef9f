package main

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/weftnet/weft/test/bench/benchlab"
)

const (
	benchNS        = "proxybench"
	endpointPort   = 8080
	changedIPOctet = 255 // 10.244.255.x: only ever written by a change
)

func svcName(i int) string   { return fmt.Sprintf("svc-%05d", i) }
func sliceName(i int) string { return svcName(i) + "-bench" }

// seedIP is the j-th endpoint of service i: 10.244.0-249.1-250, never in
// 10.244.255.0/24, which the change phase uses.
// peerNodes is how many nodes the seeded endpoints are spread over.
const peerNodes = 100

func seedIP(i, j, perSvc int) string {
	k := i*perSvc + j
	return netip.AddrFrom4([4]byte{10, 244, byte(k / 250 % 250), byte(k%250 + 1)}).String()
}

// seed creates Services [from, to), each a selector-less ClusterIP Service
// (so the EndpointSlice controller leaves it alone) with a hand-made
// EndpointSlice of perSvc ready endpoints.
func seed(ctx context.Context, c kubernetes.Interface, from, to, perSvc int) error {
	if err := benchlab.EnsureNamespace(ctx, c, benchNS); err != nil {
		return err
	}
	return benchlab.Parallel(ctx, from, to, func(i int) error {
		if err := seedOne(ctx, c, i, perSvc); err != nil {
			return fmt.Errorf("seeding %s: %w", svcName(i), err)
		}
		return nil
	})
}

func seedOne(ctx context.Context, c kubernetes.Interface, i, perSvc int) error {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: svcName(i)},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Ports: []corev1.ServicePort{{
			Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(endpointPort),
		}}},
	}
	if _, err := c.CoreV1().Services(benchNS).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	ready, name, proto, port := true, "http", corev1.ProtocolTCP, int32(endpointPort)
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: sliceName(i), Labels: map[string]string{
			discoveryv1.LabelServiceName: svcName(i),
			discoveryv1.LabelManagedBy:   "proxybench.weft.dev",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Protocol: &proto, Port: &port}},
	}
	for j := 0; j < perSvc; j++ {
		// As the EndpointSlice controller writes them: every endpoint names
		// its node (pods spread over other nodes than the measured one).
		node := fmt.Sprintf("peer-%d", (i*perSvc+j)%peerNodes)
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{seedIP(i, j, perSvc)},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			NodeName:   &node,
		})
	}
	_, err := c.DiscoveryV1().EndpointSlices(benchNS).Create(ctx, slice, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// changeOne gives the first endpoint of service i's slice the address ip,
// with the time of the change in endpoints.kubernetes.io/last-change-trigger-time
// as the EndpointSlice controller writes it (the proxies measure their
// network programming latency from it). It reads the slice first and calls
// before() just before the update, so the measured time starts at the write.
func changeOne(ctx context.Context, c kubernetes.Interface, i int, ip string, before func()) error {
	s, err := c.DiscoveryV1().EndpointSlices(benchNS).Get(ctx, sliceName(i), metav1.GetOptions{})
	if err != nil {
		return err
	}
	s.Endpoints[0].Addresses = []string{ip}
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[corev1.EndpointsLastChangeTriggerTime] = time.Now().UTC().Format(time.RFC3339Nano)
	before()
	_, err = c.DiscoveryV1().EndpointSlices(benchNS).Update(ctx, s, metav1.UpdateOptions{})
	return err
}

// ensureNode creates the Node the measured proxies run as, with an
// InternalIP, so kube-proxy finds its node IP at once. Nothing keeps it
// Ready; the proxies do not need that.
func ensureNode(ctx context.Context, c kubernetes.Interface, name, ip string) error {
	if _, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeHostName, Address: name}}
		_, err = c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
}

func clusterIP(ctx context.Context, c kubernetes.Interface, i int) (string, error) {
	s, err := c.CoreV1().Services(benchNS).Get(ctx, svcName(i), metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	return s.Spec.ClusterIP, nil
}
