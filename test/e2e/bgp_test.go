package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/internal/nlutil"
	"github.com/weftnet/weft/lab"
	"github.com/weftnet/weft/routing/bgp"
)

// TestBGPRacks runs weft's BGP routing on a lab of two racks behind a ToR
// running BIRD: no overlay, pods routed natively. weftctl check passes
// across racks; the ToR holds every podCIDR via its node, over MD5
// sessions; the external host behind the ToR reaches a pod at its own
// address and the pod sees the host's; the default route the ToR
// announces is refused; an eTP=Local LB IP is routed by the ToR only to
// the node with its endpoint; FRR added live as an external peer gets
// only what its node originates, and its default route and the cluster's
// pod CIDR are refused; the lab's eBPF proxy switched to direct server
// return answers a NodePort client from the backend's node, across the
// ToR; a cross-rack stream lives through the SIGKILL and restart of both
// its agents; a deleted node's podCIDR leaves the ToR and the other nodes.
func TestBGPRacks(t *testing.T) {
	c := upOptions(t, lab.Options{Nodes: 3, Routing: "bgp", Racks: 2, ProxyMode: "ebpf"})
	ctx := context.Background()
	nodes := lab.NodeMembers(c.state.Members)
	cidrs := map[string]string{}
	for _, m := range nodes {
		cidrs[m.Name] = podCIDR(t, c, m.Name)
		waitUntil(t, "the ToR's route to "+m.Name+"'s pods", func() error {
			return torRoute(ctx, c, cidrs[m.Name], m.IP.String())
		})
	}
	if out, err := lab.Birdc(ctx, c.dir, "show", "protocols", "all", "node1"); err != nil || !strings.Contains(out, "Established") {
		t.Fatalf("the ToR's session with node1: %v\n%s", err, out)
	}
	// node1 (rack 0) routes to node2's pods (rack 1) by BGP through its ToR.
	waitUntil(t, "node1's BGP route to node2's pods", func() error {
		got := bgpRoutes(t, c.node("node1"))
		if gw := got[cidrs["node2"]]; gw != lab.ToRAddr(0) {
			return fmt.Errorf("node1's BGP routes %v: %s via %q, want via the ToR %s", got, cidrs["node2"], gw, lab.ToRAddr(0))
		}
		if _, ok := got["0.0.0.0/0"]; ok {
			return fmt.Errorf("node1 installed the ToR's default route: %v", got)
		}
		return nil
	})
	c.mustCheck(t)

	// A pod on rack 1, reached from the external host at its own address.
	pods := map[string]*corev1.Pod{}
	for _, node := range []string{"node1", "node2"} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "bgp-" + node},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "w", Image: lab.WorkloadImage}}}}
		if _, err := c.client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pods[node] = waitRunning(t, c, "default", p.Name)
	}
	ext := c.node("ext")
	waitUntil(t, "the external host to node2's pod", func() error {
		r, err := c.fetch(ext.NSPath(), "http://"+pods["node2"].Status.PodIP+"/")
		if err == nil && r.Client != ext.IP.String() {
			return fmt.Errorf("%s saw %s, want the external host's %s", r.Pod, r.Client, ext.IP)
		}
		return err
	})

	lbLocal(t, c)
	frrPeer(t, c)
	directServerReturn(t, c) // node1 (rack 0) to node2 (rack 1) through the ToR

	// Both agents of a cross-rack stream killed and restarted: routes stay
	// in the kernels and at the ToR (graceful restart), the stream lives.
	src := c.podNS(t, pods["node1"])
	s := openStream(t, c, "cross-rack stream", src, net.JoinHostPort(pods["node2"].Status.PodIP, "81"))
	for _, d := range []string{"node1-agent", "node2-agent"} {
		if err := lab.Restart(c.dir, d); err != nil {
			t.Fatal(err)
		}
		s.exchange(t, "after the restart of "+d)
	}
	for _, n := range []string{"node1", "node2"} {
		waitHealthy(t, c.node(n).NSPath(), fmt.Sprintf("http://%s:%d/healthz", c.node(n).IP, lab.AgentPort))
	}
	s.exchange(t, "after both restarts")

	// node3 leaves the cluster: its podCIDR leaves the ToR and node2.
	if err := c.client.CoreV1().Nodes().Delete(ctx, "node3", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "node3's podCIDR withdrawn", func() error {
		if err := torRoute(ctx, c, cidrs["node3"], ""); err == nil {
			return fmt.Errorf("the ToR still routes %s", cidrs["node3"])
		}
		if gw, ok := bgpRoutes(t, c.node("node2"))[cidrs["node3"]]; ok {
			return fmt.Errorf("node2 still routes %s via %s", cidrs["node3"], gw)
		}
		return nil
	})
}

// lbLocal: a LoadBalancer Service with externalTrafficPolicy Local whose
// only endpoint is on node2: only node2 announces its ingress IP, so the
// ToR routes it to node2 alone, and the external host reaches the pod
// through it with its own address kept.
func lbLocal(t *testing.T, c *cluster) {
	t.Helper()
	ctx := context.Background()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "lb-node2", Labels: map[string]string{"app": "lb"}},
		Spec: corev1.PodSpec{NodeName: "node2", Containers: []corev1.Container{{Name: "w", Image: lab.WorkloadImage}}}}
	if _, err := c.client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRunning(t, c, "default", p.Name)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "lb"}, Spec: corev1.ServiceSpec{
		Type: corev1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
		Selector: map[string]string{"app": "lb"}, Ports: []corev1.ServicePort{{Name: "http", Port: 80}},
	}}
	if _, err := c.client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The lab's load balancer allocates the address; the nodes announce
	// it.
	var lbIP string
	waitUntil(t, "the Service's load-balancer address", func() error {
		s, err := c.client.CoreV1().Services("default").Get(ctx, svc.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(s.Status.LoadBalancer.Ingress) != 1 {
			return fmt.Errorf("status %+v", s.Status.LoadBalancer)
		}
		lbIP = s.Status.LoadBalancer.Ingress[0].IP
		return nil
	})
	c.waitEndpoints(t, "lb", 1)
	waitUntil(t, "the ToR's route to the eTP=Local LB IP", func() error {
		if err := torRoute(ctx, c, lbIP+"/32", c.node("node2").IP.String()); err != nil {
			return err
		}
		for _, n := range []string{"node1", "node3"} {
			if err := torRoute(ctx, c, lbIP+"/32", c.node(n).IP.String()); err == nil {
				return fmt.Errorf("the ToR routes %s via %s, which has no endpoint", lbIP, n)
			}
		}
		return nil
	})
	ext := c.node("ext")
	waitUntil(t, "the external host to the LB IP", func() error {
		r, err := c.fetch(ext.NSPath(), "http://"+lbIP+"/")
		if err == nil && (r.Pod != "lb-node2" || r.Client != ext.IP.String()) {
			return fmt.Errorf("%s saw %s, want lb-node2 seeing the external host's %s", r.Pod, r.Client, ext.IP)
		}
		return err
	})
}

// frrPeer adds an external peer of another kind to the live BGP
// configuration: FRR's bgpd on the external host, an eBGP multihop peer
// of node1 that announces a default route and the cluster's pod CIDR.
// node1 gives it its own podCIDR (and not what it learned from the other
// nodes) and installs neither of its routes.
func frrPeer(t *testing.T, c *cluster) {
	t.Helper()
	ctx := context.Background()
	ext, node1 := c.node("ext"), c.node("node1")
	dir := t.TempDir()
	conf := fmt.Sprintf(`frr defaults datacenter
hostname ext
router bgp 65100
 bgp router-id %[1]s
 no bgp ebgp-requires-policy
 no bgp network import-check
 neighbor %[2]s remote-as %[3]d
 neighbor %[2]s ebgp-multihop 5
 address-family ipv4 unicast
  network 0.0.0.0/0
  network %[4]s
 exit-address-family
`, ext.IP, node1.IP, 64512, lab.ClusterCIDR)
	if err := os.WriteFile(filepath.Join(dir, "bgpd.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	bgpd := exec.Command("/usr/lib/frr/bgpd", "-Z", "-S", "-n", "-f", filepath.Join(dir, "bgpd.conf"),
		"-i", filepath.Join(dir, "bgpd.pid"), "--vty_socket", dir, "-P", "0", "--log", "file:"+filepath.Join(dir, "bgpd.log"))
	if err := netnsutil.Do(ext.NSPath(), bgpd.Start); err != nil {
		t.Fatalf("starting FRR's bgpd: %v", err)
	}
	t.Cleanup(func() { _ = bgpd.Process.Kill(); _ = bgpd.Wait() })
	vtysh := func(cmd string) (map[string]any, error) {
		var out []byte
		err := netnsutil.Do(ext.NSPath(), func() (err error) {
			out, err = exec.Command("vtysh", "--vty_socket", dir, "-c", cmd).Output()
			return err
		})
		var v map[string]any
		if err == nil {
			err = json.Unmarshal(out, &v)
		}
		return v, err
	}

	cm, err := c.client.CoreV1().ConfigMaps("weft-system").Get(ctx, "weft-bgp", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["config.yaml"] = strings.Replace(cm.Data["config.yaml"], "peers:\n", fmt.Sprintf(`peers:
  - name: frr-ext
    address: %s
    asn: 65100
    multihopTTL: 5
    families: [ipv4]
    nodeSelector: {kubernetes.io/hostname: node1}
`, ext.IP), 1)
	if _, err := c.client.CoreV1().ConfigMaps("weft-system").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	own, other := podCIDR(t, c, "node1"), podCIDR(t, c, "node2")
	waitUntil(t, "FRR's routes from node1", func() error {
		v, err := vtysh("show bgp ipv4 unicast json")
		if err != nil {
			return err
		}
		routes, _ := v["routes"].(map[string]any)
		if _, ok := routes[own]; !ok {
			return fmt.Errorf("FRR has no route to node1's %s: %v", own, routes)
		}
		if _, ok := routes[other]; ok {
			return fmt.Errorf("node1 gave FRR node2's %s, which it only learned", other)
		}
		return nil
	})
	waitUntil(t, "FRR's announcements sent to node1", func() error {
		v, err := vtysh("show bgp neighbors " + node1.IP.String() + " json")
		if err != nil {
			return err
		}
		// Its 2, and what it learned from node1 if it sends it back.
		if n, _ := jsonPath(v, node1.IP.String(), "addressFamilyInfo", "ipv4Unicast", "sentPrefixCounter").(float64); n < 2 {
			return fmt.Errorf("FRR sent node1 %v prefixes, want at least its 2", n)
		}
		return nil
	})
	// node1 received both; an import policy that let them in would have
	// them in the kernel at once: they must stay out.
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		got := bgpRoutes(t, node1)
		for _, refused := range []string{"0.0.0.0/0", lab.ClusterCIDR} {
			if gw, ok := got[refused]; ok {
				t.Fatalf("node1 installed %s via %s from FRR", refused, gw)
			}
		}
	}
}

// jsonPath walks nested JSON objects.
func jsonPath(v any, keys ...string) any {
	for _, k := range keys {
		m, _ := v.(map[string]any)
		v = m[k]
	}
	return v
}

// waitUntil retries check until it passes; the bound only stops a hang.
func waitUntil(t *testing.T, what string, check func() error) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if err = check(); err == nil {
			return
		}
	}
	t.Fatalf("%s: %v", what, err)
}

// torRoute checks that the ToR routes prefix, via next hop if given.
func torRoute(ctx context.Context, c *cluster, prefix, via string) error {
	out, err := lab.Birdc(ctx, c.dir, "show", "route", prefix)
	if err != nil {
		return err
	}
	if !strings.Contains(out, prefix) || via != "" && !strings.Contains(out, "via "+via+" ") {
		return fmt.Errorf("the ToR's route to %s, want via %q:\n%s", prefix, via, out)
	}
	return nil
}

// bgpRoutes lists a node's routes of weft's BGP protocol: destination to
// the first next hop.
func bgpRoutes(t *testing.T, m lab.Member) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := netnsutil.Do(m.NSPath(), func() error {
		routes, err := nlutil.Dump("routes", func() ([]netlink.Route, error) {
			return netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Protocol: bgp.RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
		})
		for _, r := range routes {
			dst := "0.0.0.0/0"
			if r.Dst != nil {
				dst = r.Dst.String()
			}
			switch {
			case r.Gw != nil:
				out[dst] = r.Gw.String()
			case len(r.MultiPath) > 0:
				out[dst] = r.MultiPath[0].Gw.String()
			default:
				out[dst] = ""
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
