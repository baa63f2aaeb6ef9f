package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/lab"
	"github.com/weftnet/weft/lab/workload"
)

// fetch GETs url from inside the namespace at nsPath, as a process there
// would (lab.State.Dialer).
func (c *cluster) fetch(nsPath, url string) (workload.Reply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return workload.HTTPGetVia(ctx, c.state.Dialer(nsPath), url)
}

func (c *cluster) pod(t *testing.T, name, node string, labels map[string]string) (*corev1.Pod, string) {
	t.Helper()
	if _, err := c.client.CoreV1().Pods("default").Create(context.Background(), lab.WorkloadPod(name, node, labels), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := waitRunning(t, c, "default", name)
	return p, c.podNS(t, p)
}

// podNS is a running pod's network namespace.
func (c *cluster) podNS(t *testing.T, p *corev1.Pod) string {
	t.Helper()
	ns, err := c.state.PodNetNS(p)
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

func (c *cluster) waitEndpoints(t *testing.T, svc string, ready int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		list, err := c.client.DiscoveryV1().EndpointSlices("default").List(context.Background(),
			metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc})
		n := 0
		if err == nil {
			for _, s := range list.Items {
				for _, e := range s.Endpoints {
					if e.Conditions.Ready != nil && *e.Conditions.Ready {
						n++
					}
				}
			}
		}
		if n == ready {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("service %s has %d ready endpoints, want %d (%v)", svc, n, ready, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestServices runs weft's proxy (inside weft-agent) on a lab, with each
// backend: ClusterIP from a pod and from a node, NodePort from outside, a
// readiness flip, a Service without endpoints, a scheduled Deployment
// behind a Service, and weftctl check. The nftables lab runs the whole
// nftables data plane (deploy/overlays/nftables): NetworkPolicy and the
// agent's rules too, so it also runs NetworkPolicy scenarios. The eBPF
// lab routes over VXLAN and then switches to direct server return.
func TestServices(t *testing.T) {
	for _, mode := range lab.ProxyModes {
		t.Run(mode, func(t *testing.T) {
			var stray *exec.Cmd
			if mode == "ebpf" {
				stray = crashedLabCgroup(t, "node1")
			}
			// The iptables lab is dual-stack.
			o := lab.Options{Nodes: 3, Routing: "hostgw", ProxyMode: mode, DualStack: mode == "iptables"}
			if mode == "nftables" {
				// The nftables data plane by its own flag (weftctl lab up
				// --dataplane nftables): the proxy mode follows.
				o = lab.Options{Nodes: 3, Routing: "hostgw", Dataplane: "nftables"}
			}
			if mode == "ebpf" {
				o.Routing = "vxlan" // DSR's option crosses the tunnel
			}
			c := upOptions(t, o)
			if stray != nil {
				if err := stray.Wait(); err == nil {
					t.Errorf("a crashed lab's process survived the next lab's start")
				}
			}
			services(t, c)
			loadBalancer(t, c)
			c.mustCheck(t)
			if mode == lab.ProxyModes[0] {
				extendedResources(t, c) // the kubelet's part, the same in every mode
			}
			if mode == "nftables" {
				nftablesDataplane(t, c)
				clusterNetworkPolicy(t, networkPolicy(t, c, 10), 5)
			}
			if mode == "ebpf" {
				directServerReturn(t, c)
			}
		})
	}
}

// nftablesDataplane checks that every node runs weft's nftables tables
// and has no weft iptables chain.
func nftablesDataplane(t *testing.T, c *cluster) {
	t.Helper()
	for _, m := range lab.NodeMembers(c.state.Members) {
		var tables, chains []byte
		err := netnsutil.Do(m.NSPath(), func() (err error) {
			if tables, err = exec.Command("nft", "list", "tables").CombinedOutput(); err != nil {
				return err
			}
			if _, lerr := exec.LookPath("iptables-nft-save"); lerr == nil {
				chains, err = exec.Command("iptables-nft-save").CombinedOutput()
			}
			return err
		})
		if err != nil {
			t.Fatalf("%s: %v\n%s%s", m.Name, err, tables, chains)
		}
		for _, want := range []string{"table inet weft\n", "table inet weft-policy\n", "table bridge weft-policy\n", "table inet weft-agent\n"} {
			if !strings.Contains(string(tables), want) {
				t.Errorf("%s: no %q in nft list tables:\n%s", m.Name, strings.TrimSpace(want), tables)
			}
		}
		if strings.Contains(string(chains), "WEFT") {
			t.Errorf("%s: weft iptables chains on the nftables data plane:\n%s", m.Name, chains)
		}
	}
}

func services(t *testing.T, c *cluster) {
	ctx := context.Background()
	app := map[string]string{"app": "web"}
	c.pod(t, "web-1", "node1", app)
	web2, _ := c.pod(t, "web-2", "node2", app)
	client, clientNS := c.pod(t, "client", "node3", nil)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: corev1.ServiceSpec{
		Type: corev1.ServiceTypeNodePort, Selector: app,
		Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http"), NodePort: 30080}},
	}}
	svc, err := c.client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	empty := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "empty"}, Spec: corev1.ServiceSpec{
		Selector: map[string]string{"app": "nothing"}, Ports: []corev1.ServicePort{{Port: 80}}}}
	if empty, err = c.client.CoreV1().Services("default").Create(ctx, empty, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitEndpoints(t, "web", 2)
	vip := "http://" + svc.Spec.ClusterIP + "/"

	// The proxies sync within their min-sync-period of the EndpointSlice.
	// The bound only stops a hang: a loaded machine is slow.
	answered := map[string]bool{}
	for deadline := time.Now().Add(30 * time.Second); len(answered) < 2; {
		if time.Now().After(deadline) {
			t.Fatalf("ClusterIP from a pod: answered by %v, last error %v", answered, err)
		}
		var r workload.Reply
		if r, err = c.fetch(clientNS, vip); err == nil {
			if r.Client != client.Status.PodIP {
				t.Fatalf("%s saw %s, want the client pod's %s", r.Pod, r.Client, client.Status.PodIP)
			}
			answered[r.Pod] = true
		}
	}
	if _, err := c.fetch(c.node("node3").NSPath(), vip); err != nil {
		t.Fatalf("ClusterIP from a node: %v", err)
	}
	for _, n := range []string{"node1", "node3"} {
		// Each node's proxy syncs on its own schedule: the ClusterIP above
		// only proved node3's.
		r, err := c.fetch(c.node("ext").NSPath(), "http://"+c.node(n).IP.String()+":30080/")
		for deadline := time.Now().Add(10 * time.Second); err != nil; {
			if time.Now().After(deadline) {
				t.Fatalf("NodePort on %s from outside: %v", n, err)
			}
			time.Sleep(50 * time.Millisecond)
			r, err = c.fetch(c.node("ext").NSPath(), "http://"+c.node(n).IP.String()+":30080/")
		}
		// SNAT picks the address of the way out: the underlay address towards
		// a remote endpoint (over VXLAN, the tunnel device's: the podCIDR's
		// first), the bridge's (the podCIDR's gateway) to a local one.
		cidr := netip.MustParsePrefix(podCIDR(t, c, n))
		gw, vxlan := cidr.Addr().Next().String(), cidr.Addr().String()
		if r.Client != c.node(n).IP.String() && r.Client != gw && r.Client != vxlan {
			t.Fatalf("NodePort on %s: %s saw %s, want one of %s's addresses", n, r.Pod, r.Client, n)
		}
	}
	if _, err := c.fetch(clientNS, "http://"+empty.Spec.ClusterIP+"/"); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("Service without endpoints: got %v, want connection refused", err)
	}

	// Readiness flip: web-2 must stop receiving traffic.
	flipped := time.Now()
	if err := c.state.SetReady(ctx, web2, false); err != nil {
		t.Fatal(err)
	}
	clean := 0
	for clean < 10 {
		r, err := c.fetch(clientNS, vip)
		switch {
		case err != nil:
			t.Fatalf("during the readiness flip: %v", err)
		case r.Pod == "web-2":
			clean = 0
		default:
			clean++
		}
		// A bound only against a proxy that never drops it; how fast it
		// goes is logged, not asserted.
		if clean == 0 && time.Since(flipped) > 20*time.Second {
			t.Fatalf("web-2 still answers %v after it was marked not ready", time.Since(flipped))
		}
	}
	t.Logf("web-2 out of rotation %v after the readiness flip (10 clean answers included)", time.Since(flipped).Round(time.Millisecond))
	if c.state.DualStack {
		dualStack(t, c, clientNS)
	}

	scheduledDeployment(t, c, clientNS)
}

// crashedLabCgroup leaves on the machine what a lab killed mid-run leaves
// in the cgroup v2 hierarchy: a node's cgroup with a process still in it.
// The next lab must remove both and come up.
func crashedLabCgroup(t *testing.T, node string) *exec.Cmd {
	t.Helper()
	root := t.TempDir()
	if err := unix.Mount("cgroup2", root, "cgroup2", 0, ""); err != nil {
		t.Fatalf("mounting cgroup2: %v", err)
	}
	defer unix.Unmount(root, unix.MNT_DETACH)
	g := filepath.Join(root, lab.NSPrefix+node)
	if err := os.Mkdir(g, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	if err := os.WriteFile(filepath.Join(g, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// loadBalancer: the lab's load balancer gives a LoadBalancer Service an
// address of its pool with the cleanup finalizer, and the external host
// reaches it through the nodes its checks pass: with
// externalTrafficPolicy Local only the node with the endpoint (the
// client's address, lab.LBClientIP, kept), with Cluster every node. Deleting the Service
// removes the route and the finalizer.
func loadBalancer(t *testing.T, c *cluster) {
	ctx := context.Background()
	c.pod(t, "lb-node2", "node2", map[string]string{"app": "lb"})
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "lb"}, Spec: corev1.ServiceSpec{
		Type: corev1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
		Selector: map[string]string{"app": "lb"}, Ports: []corev1.ServicePort{{Name: "http", Port: 80}},
	}}
	svc, err := c.client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var ip netip.Addr
	waitUntil(t, "the Service's load-balancer address", func() error {
		s, err := c.client.CoreV1().Services("default").Get(ctx, "lb", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(s.Status.LoadBalancer.Ingress) != 1 || !slices.Contains(s.Finalizers, lab.LBFinalizer) {
			return fmt.Errorf("status %+v, finalizers %v", s.Status.LoadBalancer, s.Finalizers)
		}
		ip, err = netip.ParseAddr(s.Status.LoadBalancer.Ingress[0].IP)
		if err == nil && !lab.LBPool.Contains(ip) {
			err = fmt.Errorf("%s is not in the lab's pool %s", ip, lab.LBPool)
		}
		return err
	})
	ext := c.node("ext")
	extRoute := func(want ...string) func() error {
		return func() error {
			var hops []string
			err := netnsutil.Do(ext.NSPath(), func() error {
				dst := &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)}
				list, err := netlink.RouteListFiltered(unix.AF_INET, &netlink.Route{Dst: dst}, netlink.RT_FILTER_DST)
				for _, r := range list {
					if r.Gw != nil {
						hops = append(hops, r.Gw.String())
					}
					for _, h := range r.MultiPath {
						hops = append(hops, h.Gw.String())
					}
				}
				return err
			})
			slices.Sort(hops)
			if err == nil && !slices.Equal(hops, want) {
				err = fmt.Errorf("the external host routes %s via %v, want %v", ip, hops, want)
			}
			return err
		}
	}
	waitUntil(t, "the route to the eTP=Local address via the endpoint's node only", extRoute(c.node("node2").IP.String()))
	waitUntil(t, "the external host to the eTP=Local address", func() error {
		r, err := c.fetch(ext.NSPath(), "http://"+ip.String()+"/")
		if err == nil && (r.Pod != "lb-node2" || r.Client != lab.LBClientIP.String()) {
			return fmt.Errorf("%s saw %s, want lb-node2 seeing the external host's %s", r.Pod, r.Client, lab.LBClientIP)
		}
		return err
	})
	svc, err = c.client.CoreV1().Services("default").Get(ctx, "lb", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
	if _, err := c.client.CoreV1().Services("default").Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var all []string
	for _, n := range lab.NodeMembers(c.state.Members) {
		all = append(all, n.IP.String())
	}
	slices.Sort(all)
	waitUntil(t, "the route to the eTP=Cluster address via every node", extRoute(all...))
	for i := range 10 {
		if _, err := c.fetch(ext.NSPath(), "http://"+ip.String()+"/"); err != nil {
			t.Fatalf("eTP=Cluster, request %d: %v", i, err)
		}
	}
	if err := c.client.CoreV1().Services("default").Delete(ctx, "lb", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the Service gone (its finalizer removed) and its route with it", func() error {
		if _, err := c.client.CoreV1().Services("default").Get(ctx, "lb", metav1.GetOptions{}); err == nil {
			return fmt.Errorf("the Service is still there")
		}
		return extRoute()()
	})
	if err := c.client.CoreV1().Pods("default").Delete(ctx, "lb-node2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// dualStack: on a dual-stack lab, a PreferDualStack Service over the web
// pods answers on its IPv6 ClusterIP from a pod (the pod's IPv6 address
// seen by the server) and its NodePort on every node's IPv6 address from
// the external host.
func dualStack(t *testing.T, c *cluster, clientNS string) {
	ctx := context.Background()
	policy := corev1.IPFamilyPolicyPreferDualStack
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web6"}, Spec: corev1.ServiceSpec{
		Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"app": "web"}, IPFamilyPolicy: &policy,
		Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}},
	}}
	svc, err := c.client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var vip6 netip.Addr
	for _, ip := range svc.Spec.ClusterIPs {
		if a, err := netip.ParseAddr(ip); err == nil && a.Is6() {
			vip6 = a
		}
	}
	if !vip6.IsValid() {
		t.Fatalf("PreferDualStack Service on a dual-stack lab: ClusterIPs %v, no IPv6 one", svc.Spec.ClusterIPs)
	}
	waitUntil(t, "the IPv6 ClusterIP from a pod", func() error {
		r, err := c.fetch(clientNS, "http://"+netip.AddrPortFrom(vip6, 80).String()+"/")
		if err == nil && !netip.MustParseAddr(r.Client).Is6() {
			err = fmt.Errorf("%s saw %s, want the client pod's IPv6 address", r.Pod, r.Client)
		}
		return err
	})
	for _, n := range lab.NodeMembers(c.state.Members) {
		url := "http://" + netip.AddrPortFrom(n.IP6, uint16(svc.Spec.Ports[0].NodePort)).String() + "/"
		waitUntil(t, "the NodePort on "+n.Name+"'s IPv6 address from outside", func() error {
			_, err := c.fetch(c.node("ext").NSPath(), url)
			return err
		})
	}
}
