package main

import (
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnp "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/weftnet/weft/policy"
	nt "github.com/weftnet/weft/policy/netpoltest"
)

// The bench's own addresses: the world's pods live in 10.244.0.0/16 (not
// wired), the two real pods on their bridge in benchNet.
const (
	benchNS    = "bench"
	nodeName   = "node1"
	namespaces = 20
	apps       = 20
)

var (
	serverIP = netip.MustParseAddr("10.250.0.2")
	clientIP = netip.MustParseAddr("10.250.0.3")
)

// world builds nPods pods over 20 namespaces, all on nodeName, plus the
// bench namespace with the real server and client pods.
func world(nPods int) policy.Input {
	var in policy.Input
	for i := range namespaces {
		in.Namespaces = append(in.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ns-%02d", i),
			Labels: map[string]string{"name": fmt.Sprintf("ns-%02d", i), "tier": fmt.Sprint(i % 4)}}})
	}
	in.Namespaces = append(in.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: benchNS, Labels: map[string]string{"name": benchNS}}})
	for j := range nPods {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns-%02d", j%namespaces), Name: fmt.Sprintf("pod-%05d", j),
			Labels: map[string]string{"app": fmt.Sprintf("app-%02d", j%apps), "role": fmt.Sprint(j % 3)}},
			Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 80}}}}}}
		nt.SetIP(p, netip.AddrFrom4([4]byte{10, 244, byte(j / 250), byte(2 + j%250)}))
		in.Pods = append(in.Pods, p)
	}
	for _, rp := range []struct {
		name string
		ip   netip.Addr
	}{{"server", serverIP}, {"client", clientIP}} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: benchNS, Name: rp.name, Labels: map[string]string{"role": rp.name}},
			Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 80}}}}}}
		nt.SetIP(p, rp.ip)
		in.Pods = append(in.Pods, p)
	}
	return in
}

// scalePolicies are n policies over the world's namespaces mixing the API's
// features: pod and namespace selectors, named ports, ipBlocks, egress.
func scalePolicies(n int) []*networkingv1.NetworkPolicy {
	var out []*networkingv1.NetworkPolicy
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	for k := range n {
		ns := fmt.Sprintf("ns-%02d", k%namespaces)
		peer := networkingv1.NetworkPolicyPeer{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": fmt.Sprint(k % 4)}},
			PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"role": fmt.Sprint(k % 3)}},
		}
		port := nt.Port(tcp, 80)
		if k%2 == 1 {
			port = nt.Named(tcp, "http")
		}
		p := nt.Policy(ns, fmt.Sprintf("pol-%04d", k), map[string]string{"app": fmt.Sprintf("app-%02d", k%apps)},
			nt.Ingress(nt.From(nt.Peers(peer), port)))
		if k%10 == 0 {
			p.Spec.Ingress = append(p.Spec.Ingress, nt.From(nt.Peers(nt.BlockPeer("172.16.0.0/12", "172.16.1.0/24"))))
		}
		if k%5 == 0 {
			p.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
			p.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{nt.To(nil, nt.Port(udp, 53), nt.Port(tcp, 53)),
				nt.To(nt.Peers(networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": fmt.Sprint((k + 1) % 4)}}}))}
		}
		out = append(out, p)
	}
	return out
}

// serverPolicies are n policies all selecting the bench server: n-1 allow
// other peers (each its own selector), the last (by name) allows the client.
// With distinctPorts each of the n-1 uses its own port (1000+k), so their
// rules cannot share a set: the worst case, one rule per policy.
func serverPolicies(n int, distinctPorts bool) []*networkingv1.NetworkPolicy {
	var out []*networkingv1.NetworkPolicy
	server := map[string]string{"role": "server"}
	for k := range n - 1 {
		peer := networkingv1.NetworkPolicyPeer{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"name": fmt.Sprintf("ns-%02d", k%namespaces)}},
			PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"role": fmt.Sprint(k % 3)}},
		}
		port := int32(80)
		if distinctPorts {
			port = int32(1000 + k)
		}
		out = append(out, nt.Policy(benchNS, fmt.Sprintf("other-%04d", k), server, nt.Ingress(nt.From(nt.Peers(peer), nt.Port(corev1.ProtocolTCP, port)))))
	}
	out = append(out, nt.Policy(benchNS, "zz-client", server,
		nt.Ingress(nt.From(nt.Peers(nt.PodPeer(map[string]string{"role": "client"})), nt.Port(corev1.ProtocolTCP, 80)))))
	return out
}

// scaleClusterPolicies are n ClusterNetworkPolicies over the world, half
// in each tier, mixing actions, subjects by namespace and by pod, peers by
// namespace, pod and network, numbered and named ports.
func scaleClusterPolicies(n int) []*cnp.ClusterNetworkPolicy {
	var out []*cnp.ClusterNetworkPolicy
	actions := []cnp.ClusterNetworkPolicyRuleAction{cnp.ClusterNetworkPolicyRuleActionDeny, cnp.ClusterNetworkPolicyRuleActionAccept, cnp.ClusterNetworkPolicyRuleActionPass}
	for k := range n {
		tier := cnp.AdminTier
		if k%2 == 1 {
			tier = cnp.BaselineTier
		}
		p := nt.ClusterPolicy(fmt.Sprintf("cnp-%04d", k), tier, int32(k%1000), metav1.LabelSelector{MatchLabels: map[string]string{"tier": fmt.Sprint(k % 4)}})
		if k%3 == 0 {
			p.Spec.Subject = cnp.ClusterNetworkPolicySubject{Pods: &cnp.NamespacedPod{
				NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"name": fmt.Sprintf("ns-%02d", k%namespaces)}},
				PodSelector:       metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app-%02d", k%apps)}}}}
		}
		proto := nt.ClusterPort(corev1.ProtocolTCP, int32(1000+k%500))
		if k%4 == 1 {
			proto = cnp.ClusterNetworkPolicyProtocol{DestinationNamedPort: "http"}
		}
		p.Spec.Ingress = []cnp.ClusterNetworkPolicyIngressRule{nt.ClusterIngress(actions[k%3],
			[]cnp.ClusterNetworkPolicyEgressPeer{nt.PodsPeer(metav1.LabelSelector{MatchLabels: map[string]string{"tier": fmt.Sprint((k + 1) % 4)}},
				metav1.LabelSelector{MatchLabels: map[string]string{"role": fmt.Sprint(k % 3)}})}, proto)}
		if k%5 == 0 {
			p.Spec.Egress = []cnp.ClusterNetworkPolicyEgressRule{nt.ClusterEgress(cnp.ClusterNetworkPolicyRuleActionDeny,
				[]cnp.ClusterNetworkPolicyEgressPeer{nt.NetworksPeer(fmt.Sprintf("192.168.%d.0/24", k%256))})}
		}
		out = append(out, p)
	}
	return out
}

// serverClusterPolicies are n Admin ClusterNetworkPolicies whose subject
// is the bench server, each denying another namespace's pods on port 80:
// none matches the client, so its connections walk every one of them
// before the NetworkPolicies decide.
func serverClusterPolicies(n int) []*cnp.ClusterNetworkPolicy {
	var out []*cnp.ClusterNetworkPolicy
	for k := range n {
		p := nt.ClusterPolicy(fmt.Sprintf("server-%04d", k), cnp.AdminTier, int32(k%1000), metav1.LabelSelector{MatchLabels: map[string]string{"name": benchNS}})
		p.Spec.Ingress = []cnp.ClusterNetworkPolicyIngressRule{nt.ClusterIngress(cnp.ClusterNetworkPolicyRuleActionDeny,
			[]cnp.ClusterNetworkPolicyEgressPeer{nt.PodsPeer(metav1.LabelSelector{MatchLabels: map[string]string{"name": fmt.Sprintf("ns-%02d", k%namespaces)}},
				metav1.LabelSelector{MatchLabels: map[string]string{"role": fmt.Sprint(k % 3)}})}, nt.ClusterPort(corev1.ProtocolTCP, 80))}
		out = append(out, p)
	}
	return out
}
