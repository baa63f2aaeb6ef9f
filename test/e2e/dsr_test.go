package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/weftnet/weft/lab"
)

// directServerReturn, on an eBPF lab (TestServices' over VXLAN,
// TestBGPRacks' routed by BGP through the ToR): its agents switched to
// --bpf-lb-mode dsr through their ConfigMap. A NodePort (eTP Cluster)
// whose one endpoint runs on node2, reached from outside on node1: the
// pod sees the outside client's own address (node1 does not masquerade;
// the SYN carries the NodePort to node2 in weft's IP option, through the
// tunnel or the ToR, and node2 answers the client from the NodePort's
// address). The same NodePort on node2 itself (a local endpoint) is
// masqueraded as in snat mode. weftctl check then passes in dsr mode
// (three nodes: its probes between nodes need them).
func directServerReturn(t *testing.T, c *cluster) {
	ctx := context.Background()
	if err := c.state.Reinstall(ctx, "bpf-lb-mode=dsr"); err != nil {
		t.Fatal(err)
	}
	rollCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if err := lab.WaitAgents(rollCtx, c.client, 3); err != nil {
		t.Fatalf("agents rolling to dsr mode: %v", err)
	}
	app := map[string]string{"app": "dsr"}
	c.pod(t, "dsr-web", "node2", app)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "dsr"}, Spec: corev1.ServiceSpec{
		Type: corev1.ServiceTypeNodePort, Selector: app,
		Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http"), NodePort: 30090}},
	}}
	if _, err := c.client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitEndpoints(t, "dsr", 1)
	ext := c.node("ext")
	extIP := ext.IP.String()
	url := func(node string) string { return fmt.Sprintf("http://%s:30090/", c.node(node).IP) }
	waitUntil(t, "the NodePort on node1 (endpoint on node2) from outside, seen with the client's address", func() error {
		r, err := c.fetch(ext.NSPath(), url("node1"))
		if err != nil {
			return err
		}
		if r.Client != extIP {
			return fmt.Errorf("%s saw %s, want the outside client's %s", r.Pod, r.Client, extIP)
		}
		return nil
	})
	for i := range 20 {
		r, err := c.fetch(ext.NSPath(), url("node1"))
		if err != nil || r.Client != extIP {
			t.Fatalf("request %d through node1: %+v %v, want the client's address %s", i, r, err, extIP)
		}
	}
	gw := netip.MustParsePrefix(podCIDR(t, c, "node2")).Addr().Next().String()
	waitUntil(t, "the NodePort on node2 (a local endpoint) from outside, masqueraded", func() error {
		r, err := c.fetch(ext.NSPath(), url("node2"))
		if err != nil {
			return err
		}
		if r.Client != gw && r.Client != c.node("node2").IP.String() {
			return fmt.Errorf("%s saw %s, want one of node2's addresses (%s, %s)", r.Pod, r.Client, gw, c.node("node2").IP)
		}
		return nil
	})
	c.mustCheck(t)
}
