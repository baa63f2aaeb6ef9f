package main

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/weftnet/weft/test/bench/benchlab"
)

// The state every subject reads through the lab's API server: two Nodes
// (the measured node and the remote one, with their InternalIPs), and a
// selector-less UDP NodePort Service, externalTrafficPolicy Cluster, whose
// hand-made EndpointSlice lists the local and the remote backends, each
// ready and naming its node.
const (
	benchNS    = "pktbench"
	svcName    = "pkt-target"
	node1Name  = "bench-node"
	node2Name  = "bench-node2"
	svcPort    = 5000
	targetPort = 9999
	nodePort   = 30999
)

func seed(ctx context.Context, c kubernetes.Interface, pods []pod) error {
	for _, n := range []struct{ name, ip string }{{node1Name, node1IP.String()}, {node2Name, node2IP.String()}} {
		if err := benchlab.EnsureNode(ctx, c, n.name, n.ip); err != nil {
			return fmt.Errorf("node %s: %w", n.name, err)
		}
	}
	if err := benchlab.EnsureNamespace(ctx, c, benchNS); err != nil {
		return err
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: svcName}, Spec: corev1.ServiceSpec{
		Type:                  corev1.ServiceTypeNodePort,
		ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyCluster,
		Ports: []corev1.ServicePort{{Name: "udp", Protocol: corev1.ProtocolUDP, Port: svcPort,
			TargetPort: intstr.FromInt32(targetPort), NodePort: nodePort}}}}
	if _, err := c.CoreV1().Services(benchNS).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating %s: %w", svcName, err)
	}
	ready, portName, proto, port := true, "udp", corev1.ProtocolUDP, int32(targetPort)
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: svcName + "-bench", Labels: map[string]string{
			discoveryv1.LabelServiceName: svcName, discoveryv1.LabelManagedBy: "pktbench.weft.dev"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Protocol: &proto, Port: &port}},
	}
	for _, p := range pods {
		node := node2Name
		if p.local {
			node = node1Name
		}
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{p.ip.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready}, NodeName: &node})
	}
	if _, err := c.DiscoveryV1().EndpointSlices(benchNS).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating %s's EndpointSlice: %w", svcName, err)
	}
	return nil
}
