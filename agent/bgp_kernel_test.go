package agent

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/internal/testutil"
	"github.com/weftnet/weft/routing/bgp"
)

// TestBGPFromTheAPI runs the agent's BGP component on a fake API server
// against a router speaker, both on the loopback of the test's private
// namespace (the router on port 1790, the node dialing out only): the
// peer, its MD5 password from a Secret, the announcements from the Node and
// an eTP=Local Service follow the API objects, and a bad ConfigMap edit
// changes nothing.
func TestBGPFromTheAPI(t *testing.T) {
	if !netnsutil.Isolated() {
		t.Skip("kernel test: needs root to run in a private network namespace")
	}
	nodeIP, routerIP := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	podCIDR, lb := netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("172.20.0.10/32")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	router := bgp.NewSpeaker(bgp.SpeakerOptions{ListenPort: 1790})
	defer router.Stop(context.Background(), false)
	if err := router.Apply(ctx, bgp.Plan{ASN: 65000, RouterID: routerIP, RestartTime: 120, Neighbors: []bgp.Neighbor{
		{Name: "node-1", Address: nodeIP, ASN: bgp.DefaultASN, Local: routerIP, Password: "s3cret", External: true, IPv4: true, IPv6: true}}}); err != nil {
		t.Fatal(err)
	}
	learned := func() []netip.Prefix {
		cands, err := router.Candidates()
		if err != nil {
			t.Fatal(err)
		}
		var out []netip.Prefix
		for _, c := range cands {
			if !c.Local && c.NextHop == nodeIP {
				out = append(out, c.Prefix)
			}
		}
		slices.SortFunc(out, func(a, b netip.Prefix) int { return strings.Compare(a.String(), b.String()) })
		return out
	}

	ready := true
	nodeName := "node-1"
	config := "peers:\n- {name: tor, address: 127.0.0.2, port: 1790, asn: 65000, passwordSecret: {name: bgp-passwords, key: tor}}\nannounce: {loadBalancerIPs: true}\n"
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "weft-system", Name: "weft-bgp"}, Data: map[string]string{bgp.ConfigKey: config}}
	client := fake.NewClientset(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}, Spec: corev1.NodeSpec{PodCIDRs: []string{podCIDR.String()}},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: nodeIP.String()}}}},
		cm,
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "weft-system", Name: "bgp-passwords"}, Data: map[string][]byte{"tor": []byte("s3cret")}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
			Spec:   corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal},
			Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: lb.Addr().String()}}}}},
		&discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-1", Labels: map[string]string{discovery.LabelServiceName: "web"}},
			Endpoints: []discovery.Endpoint{{NodeName: &nodeName, Conditions: discovery.EndpointConditions{Ready: &ready}}}},
	)
	var logs testutil.SyncBuffer
	b, err := NewBGP(client, BGPOptions{NodeName: nodeName, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		ConfigNamespace: "weft-system", ConfigName: "weft-bgp", ListenPort: -1, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = b.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	testutil.Eventually(t, 30*time.Second, "the router to learn the podCIDR and the LB IP over MD5", func() bool {
		return slices.Equal(learned(), []netip.Prefix{podCIDR, lb})
	})

	// A bad edit: refused naming the field, the peer and routes stay.
	cm.Data[bgp.ConfigKey] = "announce: {loadBalancerIPs: yes-please}\n"
	cm.ResourceVersion = "2"
	if _, err := client.CoreV1().ConfigMaps("weft-system").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "the refusal in the log", func() bool {
		l := logs.String()
		return strings.Contains(l, "ConfigMap refused") && strings.Contains(l, "weft-system/weft-bgp") && strings.Contains(l, "announce.loadBalancerIPs")
	})
	if got := learned(); !slices.Equal(got, []netip.Prefix{podCIDR, lb}) || !slices.Contains(router.Established(), nodeIP) {
		t.Errorf("after a refused edit: router learned %v, sessions %v", got, router.Established())
	}

	// The local endpoint goes: the eTP=Local address is withdrawn.
	ready = false
	es := &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-1", Labels: map[string]string{discovery.LabelServiceName: "web"}},
		Endpoints: []discovery.Endpoint{{NodeName: &nodeName, Conditions: discovery.EndpointConditions{Ready: &ready}}}}
	if _, err := client.DiscoveryV1().EndpointSlices("default").Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "the LB IP withdrawn", func() bool {
		return slices.Equal(learned(), []netip.Prefix{podCIDR})
	})
}
