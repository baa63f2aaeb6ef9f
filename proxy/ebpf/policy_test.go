package ebpf_test

import (
	"context"
	"os"
	"os/exec"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/lab/workload"
	"github.com/weftnet/weft/policy"
	polipt "github.com/weftnet/weft/policy/iptables"
	"github.com/weftnet/weft/proxy/proxytest"
)

// strictReversePath turns on strict reverse-path filtering in the test's
// network namespace, as many distributions set it: the translated packets
// keep the client's address as source, which the uplink's routes lead back
// to, so the filter passes them (and their replies).
func strictReversePath(t *testing.T) {
	t.Helper()
	for _, p := range []string{"/proc/sys/net/ipv4/conf/all/rp_filter", "/proc/sys/net/ipv4/conf/default/rp_filter"} {
		was, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("1"), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.WriteFile(p, was, 0o644) })
	}
}

// TestNetworkPolicyOnExternalTraffic: traffic from outside the node to a
// NodePort (eTP Cluster, masqueraded, and eTP Local) reaches pod a; then
// weft's NetworkPolicy backend isolates a with an ingress policy that
// admits only the outside host's second address, and the same request
// from its first address is dropped while one from the second still
// arrives: the per-packet path hands the translated packets to the
// kernel, whose FORWARD chains judge them with the client's address. The
// node filters reverse paths strictly.
func TestNetworkPolicyOnExternalTraffic(t *testing.T) {
	n := proxytest.NewNode(t, backend, "a")
	strictReversePath(t)
	nodePort := func(port int32, etp corev1.ServiceExternalTrafficPolicy) func(*corev1.Service) {
		return func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = port
			s.Spec.ExternalTrafficPolicy = etp
		}
	}
	n.Svcs = []*corev1.Service{
		proxytest.Service("cluster", "10.96.0.11", nodePort(30080, corev1.ServiceExternalTrafficPolicyCluster)),
		proxytest.Service("local", "10.96.0.12", nodePort(30081, corev1.ServiceExternalTrafficPolicyLocal)),
	}
	n.Slices = []*discoveryv1.EndpointSlice{proxytest.Slice("cluster", n.Local("a")), proxytest.Slice("local", n.Local("a"))}
	n.Sync()
	urls := map[string]string{
		"eTP Cluster": "http://" + proxytest.NodeIP + ":30080/",
		"eTP Local":   "http://" + proxytest.NodeIP + ":30081/",
	}
	for name, url := range urls {
		for _, src := range []string{proxytest.ExtIP, proxytest.ExtIP2} {
			if r, err := outsideGet(n.Ext, src, url); err != nil || r.Pod != "a" {
				t.Fatalf("%s from %s before any policy: %+v %v, want pod a", name, src, r, err)
			}
		}
	}

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "a", Labels: map[string]string{"app": "a"}},
		Spec:       corev1.PodSpec{NodeName: proxytest.NodeName},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: n.Pods["a"].IP.String(),
			PodIPs: []corev1.PodIP{{IP: n.Pods["a"].IP.String()}}},
	}
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "only-ext2"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "a"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: proxytest.ExtIP2 + "/32"}}},
			}},
		},
	}
	d := policy.Compile(policy.Input{Pods: []*corev1.Pod{pod},
		Namespaces: []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "default"}}},
		Policies:   []*networkingv1.NetworkPolicy{np}})
	a := &polipt.Applier{}
	t.Cleanup(func() { _ = a.Cleanup() })
	if _, err := a.Apply(polipt.Render(d, polipt.Config{NodeName: proxytest.NodeName})); err != nil {
		t.Fatal(err)
	}
	for name, url := range urls {
		if r, err := outsideGet(n.Ext, proxytest.ExtIP, url); err == nil {
			t.Errorf("%s from %s, which the policy does not admit: reached %s (seen from %s), want it dropped", name, proxytest.ExtIP, r.Pod, r.Client)
		}
		if r, err := outsideGet(n.Ext, proxytest.ExtIP2, url); err != nil || r.Pod != "a" {
			t.Errorf("%s from %s, which the policy admits: %+v %v, want pod a", name, proxytest.ExtIP2, r, err)
		}
	}
}

// TestNodePortRemoteBackend: a NodePort whose endpoint is on another node
// (eTP Cluster) is reached from outside: the packet is translated to the
// endpoint, routed back out of the uplink toward that node, masqueraded to
// the uplink's address with a port outside the NodePort range, and the
// reply, which comes back on the uplink, reaches the client from the
// NodePort. The other node is played by the outside host, which holds the
// endpoint's address and serves on it. The node filters reverse paths
// strictly.
func TestNodePortRemoteBackend(t *testing.T) {
	n := proxytest.NewNode(t, backend, "a")
	strictReversePath(t)
	for _, args := range [][]string{
		{"-n", "proxytest-ext", "addr", "add", proxytest.RemoteEP + "/32", "dev", "lo"},
		{"route", "add", "10.244.2.0/24", "via", proxytest.ExtIP},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ready := make(chan struct{})
	go func() {
		done <- netnsutil.Do(n.Ext, func() error {
			return workload.Run(ctx, workload.Options{Name: "remote", HTTPAddrs: []string{proxytest.RemoteEP + ":80"}}, func() { close(ready) })
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("serving on the remote endpoint: %v", err)
	}
	n.Svcs = []*corev1.Service{proxytest.Service("np", "10.96.0.11", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = 30080
	})}
	n.Slices = []*discoveryv1.EndpointSlice{proxytest.Slice("np", proxytest.Endpoint{IP: proxytest.RemoteEP, Node: proxytest.OtherNode})}
	n.Sync()
	for range 5 {
		r, err := outsideGet(n.Ext, "", "http://"+proxytest.NodeIP+":30080/")
		if err != nil || r.Pod != "remote" {
			t.Fatalf("NodePort with a remote endpoint: %+v %v, want the remote endpoint", r, err)
		}
		if r.Client != proxytest.NodeIP || r.ClientPort < 32768 || r.ClientPort > 60999 {
			t.Fatalf("the remote endpoint saw %s:%d, want the node's uplink address %s with a port in 32768-60999", r.Client, r.ClientPort, proxytest.NodeIP)
		}
	}
}
