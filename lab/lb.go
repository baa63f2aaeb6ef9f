package lab

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/weftnet/weft/internal/netnsutil"
)

// The lab's load balancer is what a cloud provider's service controller,
// or MetalLB, gives a cluster: it allocates each LoadBalancer Service an
// address from LBPool, writes it to the Service's status (with the
// cleanup finalizer a cloud controller keeps), and routes the address from
// outside the nodes to the nodes that should get its traffic: every Ready
// node whose weft-agent is healthy for externalTrafficPolicy Cluster, and
// for Local only those whose health-check node port answers 200, checked
// every second, as a cloud load balancer checks (a Service with ClientIP
// session affinity gets only the first of them). The routes are ECMP
// routes (hashed on the 5-tuple) in the namespace that routes for the
// outside: the external host on one segment, the ToR on racks. With
// --routing bgp on racks the nodes announce the addresses themselves
// (weft's BGP) and the load balancer only allocates.
const (
	// LBFinalizer is the finalizer cloud service controllers put on a
	// LoadBalancer Service, removed once its load balancer is gone.
	LBFinalizer = "service.kubernetes.io/load-balancer-cleanup"
	// excludeFromLB is the Node label that keeps a node out of load
	// balancers.
	excludeFromLB = "node.kubernetes.io/exclude-from-external-load-balancers"
	// lbRouteProto marks the routes the load balancer installs (weft's
	// own routing uses 87 and 0x58).
	lbRouteProto = 90
)

// LBPool is the lab's range of load-balancer addresses.
var LBPool = netip.MustParsePrefix("172.18.200.0/24")

// LBClientIP is the external host's source address towards load-balancer
// addresses on one segment: an address outside the nodes' network (on the
// external host's loopback; the nodes' default route leads back to it), as
// a client of a cloud load balancer is. The upstream suite checks that the
// endpoint of an externalTrafficPolicy Local Service sees a client outside
// the nodes' /16.
var LBClientIP = netip.MustParseAddr("172.19.0.100")

// lbDaemon is the lab's load balancer (weftctl lab lb), in the namespace
// whose routes it programs, or in the external host's when the nodes
// announce the addresses.
func lbDaemon(o Options) Proc {
	routeNS := lbRouteNS(o)
	ns := routeNS
	if ns == "" {
		ns = ExternalNS
	}
	args := []string{filepath.Join(o.BinDir, "weftctl"), "lab", "lb", "--kubeconfig", AdminKubeconfig(o.Dir), "--pool", LBPool.String()}
	if routeNS != "" {
		args = append(args, "--route")
	}
	if routeNS == ExternalNS {
		args = append(args, "--src", LBClientIP.String())
	}
	return Proc{Name: "lb", NS: netnsutil.RunDir + "/" + ns, Args: args}
}

// lbRouteNS is the namespace that routes the outside's traffic to the
// nodes, or "" where the nodes announce load-balancer addresses by BGP.
func lbRouteNS(o Options) string {
	switch {
	case o.Racks <= 1:
		return ExternalNS
	case o.Routing == "bgp":
		return ""
	}
	return ToRNS
}

// wantsLB reports whether the lab's load balancer serves s: a
// LoadBalancer Service of no other load-balancer class, not being deleted.
func wantsLB(s *corev1.Service) bool {
	return s.Spec.Type == corev1.ServiceTypeLoadBalancer && s.Spec.LoadBalancerClass == nil && s.DeletionTimestamp == nil
}

// assignLBIPs gives every Service wantsLB accepts an address of pool:
// first the one its status already has (if in the pool and not taken),
// then the one spec.loadBalancerIP asks for, then the lowest free one.
// Services it cannot serve are left out, each with an error naming it
// and the field. Pure.
func assignLBIPs(svcs []*corev1.Service, pool netip.Prefix) (map[types.NamespacedName]netip.Addr, []error) {
	var want []*corev1.Service
	for _, s := range svcs {
		if wantsLB(s) && (len(s.Spec.IPFamilies) == 0 || slices.Contains(s.Spec.IPFamilies, family(pool))) {
			want = append(want, s)
		}
	}
	sort.Slice(want, func(i, j int) bool { return key(want[i]).String() < key(want[j]).String() })
	got := map[types.NamespacedName]netip.Addr{}
	taken := map[netip.Addr]bool{}
	take := func(s *corev1.Service, a netip.Addr) {
		got[key(s)], taken[a] = a, true
	}
	for _, s := range want {
		for _, ing := range s.Status.LoadBalancer.Ingress {
			if a, err := netip.ParseAddr(ing.IP); err == nil && usableIn(pool, a) && !taken[a] {
				take(s, a)
				break
			}
		}
	}
	var errs []error
	for _, s := range want {
		if _, ok := got[key(s)]; ok || s.Spec.LoadBalancerIP == "" {
			continue
		}
		a, err := netip.ParseAddr(s.Spec.LoadBalancerIP)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("service %s: spec.loadBalancerIP: %w", key(s), err))
		case !usableIn(pool, a):
			errs = append(errs, fmt.Errorf("service %s: spec.loadBalancerIP: %s is not in the lab's pool %s", key(s), a, pool))
		case taken[a]:
			errs = append(errs, fmt.Errorf("service %s: spec.loadBalancerIP: %s is another Service's", key(s), a))
		default:
			take(s, a)
		}
	}
	next := pool.Addr().Next()
	for _, s := range want {
		if _, ok := got[key(s)]; ok || s.Spec.LoadBalancerIP != "" {
			continue
		}
		for usableIn(pool, next) && taken[next] {
			next = next.Next()
		}
		if !usableIn(pool, next) {
			errs = append(errs, fmt.Errorf("service %s: the lab's load-balancer pool %s is exhausted", key(s), pool))
			continue
		}
		take(s, next)
	}
	return got, errs
}

func family(p netip.Prefix) corev1.IPFamily {
	if p.Addr().Is4() {
		return corev1.IPv4Protocol
	}
	return corev1.IPv6Protocol
}

// usableIn reports whether a is a host address of pool (neither its
// network address nor, for IPv4, its broadcast address).
func usableIn(pool netip.Prefix, a netip.Addr) bool {
	pool = pool.Masked()
	if !pool.Contains(a) || a == pool.Addr() {
		return false
	}
	if a.Is4() && pool.Bits() < 31 {
		first, x := pool.Addr().As4(), a.As4()
		broadcast := binary.BigEndian.Uint32(first[:]) | (1<<(32-pool.Bits()) - 1)
		return binary.BigEndian.Uint32(x[:]) != broadcast
	}
	return true
}

func key(s *corev1.Service) types.NamespacedName {
	return types.NamespacedName{Namespace: s.Namespace, Name: s.Name}
}

// lbTarget is a node a load-balancer address may send traffic to, and the
// check that decides whether it does.
type lbTarget struct {
	node string
	ip   netip.Addr
	port int    // the health check's port
	path string // and path
}

// lbTargets lists the candidate nodes of s: Ready nodes not excluded from
// load balancers, with the check a cloud load balancer would run (the
// health-check node port for externalTrafficPolicy Local, weft-agent's
// /healthz otherwise). Pure.
func lbTargets(s *corev1.Service, nodes []*corev1.Node) []lbTarget {
	var out []lbTarget
	for _, n := range nodes {
		if _, excluded := n.Labels[excludeFromLB]; excluded || !nodeReady(n) {
			continue
		}
		ip := internalIP(n)
		if !ip.IsValid() {
			continue
		}
		t := lbTarget{node: n.Name, ip: ip, port: AgentPort, path: "/healthz"}
		if s.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
			t.port, t.path = int(s.Spec.HealthCheckNodePort), "/"
		}
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].node < out[j].node })
	return out
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func internalIP(n *corev1.Node) netip.Addr {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			if ip, err := netip.ParseAddr(a.Address); err == nil && ip.Is4() {
				return ip
			}
		}
	}
	return netip.Addr{}
}

// LBOptions configure RunLB.
type LBOptions struct {
	Kubeconfig string
	Pool       netip.Prefix
	// Route: program the addresses' routes in the process's namespace.
	Route bool
	// Src, when valid, is the source address the routes prefer, added to
	// the namespace's loopback.
	Src      netip.Addr
	Interval time.Duration // between passes; default 1s
	Log      *slog.Logger
}

// RunLB runs the lab's load balancer until ctx ends.
func RunLB(ctx context.Context, o LBOptions) error {
	if o.Interval == 0 {
		o.Interval = time.Second
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	client, err := Client(o.Kubeconfig)
	if err != nil {
		return err
	}
	lb := &loadBalancer{LBOptions: o, client: client, http: &http.Client{Timeout: time.Second}}
	if o.Route {
		// Spread connections over the next hops by their ports too, as a
		// load balancer does, not by addresses only.
		if err := os.WriteFile("/proc/sys/net/ipv4/fib_multipath_hash_policy", []byte("1"), 0o644); err != nil {
			return fmt.Errorf("ECMP hashing on ports: %w", err)
		}
		h, err := netns.Get()
		if err != nil {
			return err
		}
		if lb.nl, err = netlink.NewHandleAt(h); err != nil {
			return err
		}
		if err := lb.sink(); err != nil {
			return err
		}
		if o.Src.IsValid() {
			lo, err := lb.nl.LinkByName("lo")
			if err != nil {
				return err
			}
			a := &netlink.Addr{IPNet: &net.IPNet{IP: o.Src.AsSlice(), Mask: net.CIDRMask(o.Src.BitLen(), o.Src.BitLen())}}
			if err := lb.nl.AddrReplace(lo, a); err != nil {
				return fmt.Errorf("the clients' source address %s: %w", o.Src, err)
			}
		}
	}
	f := informers.NewSharedInformerFactory(client, 0)
	svcs, nodes := f.Core().V1().Services().Lister(), f.Core().V1().Nodes().Lister()
	f.Start(ctx.Done())
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("syncing the %v informer", typ)
		}
	}
	tick := time.NewTicker(o.Interval)
	defer tick.Stop()
	for {
		s, _ := svcs.List(labels.Everything())
		n, _ := nodes.List(labels.Everything())
		lb.pass(ctx, s, n)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

type loadBalancer struct {
	LBOptions
	client kubernetes.Interface
	http   *http.Client
	nl     *netlink.Handle
	logged map[string]bool // errors logged once, until they go
}

// pass brings the Services' status and finalizers and the routes in line
// with the cluster.
func (lb *loadBalancer) pass(ctx context.Context, svcs []*corev1.Service, nodes []*corev1.Node) {
	ips, errs := assignLBIPs(svcs, lb.Pool)
	now := map[string]bool{}
	for _, err := range errs {
		now[err.Error()] = true
		if !lb.logged[err.Error()] {
			lb.Log.Warn("load balancer", "err", err)
		}
	}
	lb.logged = now
	for _, s := range svcs {
		if err := lb.syncService(ctx, s, ips); err != nil {
			lb.Log.Warn("load balancer: updating service", "service", key(s).String(), "err", err)
		}
	}
	if lb.nl == nil {
		return
	}
	routes := map[netip.Addr][]netip.Addr{}
	for _, s := range svcs {
		if a, ok := ips[key(s)]; ok && wantsLB(s) {
			targets := lbTargets(s, nodes)
			hops := lb.healthy(ctx, targets)
			if len(hops) == 0 {
				// No node passes: fail open, to every candidate, as cloud
				// load balancers do (their proxies refuse what they
				// cannot serve).
				for _, t := range targets {
					hops = append(hops, t.ip)
				}
			}
			if len(hops) == 0 {
				continue // no candidate: the pool's sink drops it
			}
			if s.Spec.SessionAffinity == corev1.ServiceAffinityClientIP && len(hops) > 1 {
				// A client keeps its backend only if it keeps its node
				// (each node's proxy keeps its own affinity): one next
				// hop, the first healthy node, as a cloud load balancer
				// with client-IP affinity sends a client to one node.
				hops = hops[:1]
			}
			routes[a] = hops
		}
	}
	if err := lb.syncRoutes(routes); err != nil {
		lb.Log.Warn("load balancer: routes", "err", err)
	}
}

// syncService writes s's finalizer and status: the finalizer and the
// address while the lab serves it, neither once it does not.
func (lb *loadBalancer) syncService(ctx context.Context, s *corev1.Service, ips map[types.NamespacedName]netip.Addr) error {
	has := slices.Contains(s.Finalizers, LBFinalizer)
	if wantsLB(s) && !has {
		c := s.DeepCopy()
		c.Finalizers = append(c.Finalizers, LBFinalizer)
		var err error
		if s, err = lb.client.CoreV1().Services(s.Namespace).Update(ctx, c, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("adding finalizer: %w", err)
		}
	}
	want := corev1.LoadBalancerStatus{}
	if a, ok := ips[key(s)]; ok && wantsLB(s) {
		vip := corev1.LoadBalancerIPModeVIP
		want.Ingress = []corev1.LoadBalancerIngress{{IP: a.String(), IPMode: &vip}}
	}
	if (wantsLB(s) || has) && !equality.Semantic.DeepEqual(s.Status.LoadBalancer, want) {
		c := s.DeepCopy()
		c.Status.LoadBalancer = want
		var err error
		if s, err = lb.client.CoreV1().Services(s.Namespace).UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("status: %w", err)
		}
		var ips []string
		for _, ing := range want.Ingress {
			ips = append(ips, ing.IP)
		}
		lb.Log.Info("load balancer", "service", key(s).String(), "ingress", ips)
	}
	if !wantsLB(s) && has {
		c := s.DeepCopy()
		c.Finalizers = slices.DeleteFunc(c.Finalizers, func(f string) bool { return f == LBFinalizer })
		if _, err := lb.client.CoreV1().Services(s.Namespace).Update(ctx, c, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("removing finalizer: %w", err)
		}
	}
	return nil
}

// healthy runs the targets' checks in parallel and returns the addresses
// of those that passed.
func (lb *loadBalancer) healthy(ctx context.Context, targets []lbTarget) []netip.Addr {
	ok := make([]bool, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Go(func() {
			url := "http://" + net.JoinHostPort(t.ip.String(), strconv.Itoa(t.port)) + t.path
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				return
			}
			resp, err := lb.http.Do(req)
			if err != nil {
				return
			}
			resp.Body.Close()
			ok[i] = resp.StatusCode == http.StatusOK
		})
	}
	wg.Wait()
	var out []netip.Addr
	for i, t := range targets {
		if ok[i] {
			out = append(out, t.ip)
		}
	}
	return out
}

// syncRoutes makes the namespace's load-balancer routes these: each
// address routed over its next hops (ECMP); routes of addresses no longer
// served are removed (their traffic goes to the pool's sink). Unchanged
// routes are left alone.
func (lb *loadBalancer) syncRoutes(want map[netip.Addr][]netip.Addr) error {
	have, err := lb.nl.RouteListFiltered(unix.AF_INET, &netlink.Route{Protocol: lbRouteProto}, netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return fmt.Errorf("listing routes: %w", err)
	}
	current := map[netip.Addr]netlink.Route{}
	for _, r := range have {
		if ones, _ := r.Dst.Mask.Size(); ones != 32 {
			continue // the pool's sink route
		}
		if a, ok := netip.AddrFromSlice(r.Dst.IP); ok {
			current[a.Unmap()] = r
		}
	}
	var errs []error
	for a, hops := range want {
		r := lbRoute(a, hops, lb.Src)
		if c, ok := current[a]; ok && sameHops(c, r) {
			continue
		}
		if err := lb.nl.RouteReplace(&r); err != nil {
			errs = append(errs, fmt.Errorf("route to %s: %w", a, err))
		}
	}
	for a, r := range current {
		if _, ok := want[a]; !ok {
			if err := lb.nl.RouteDel(&r); err != nil {
				errs = append(errs, fmt.Errorf("removing the route to %s: %w", a, err))
			}
		}
	}
	return errors.Join(errs...)
}

// sinkLink is where the pool's addresses that no Service has go: a veth
// whose peer is down, so that what is sent there is dropped without an
// error, as an address nothing answers on the Internet is (a client times
// out; an unreachable route would fail its connect at once, which the
// upstream suite's "load balancer closed" checks take for an error).
const sinkLink = "lb-sink"

// sink makes the sink link and routes the pool to it.
func (lb *loadBalancer) sink() error {
	link, err := lb.nl.LinkByName(sinkLink)
	if err != nil {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: sinkLink}, PeerName: sinkLink + "-down"}
		if err := lb.nl.LinkAdd(veth); err != nil {
			return fmt.Errorf("the pool's sink: %w", err)
		}
		if link, err = lb.nl.LinkByName(sinkLink); err != nil {
			return err
		}
	}
	if err := lb.nl.LinkSetARPOff(link); err != nil {
		return err
	}
	if err := lb.nl.LinkSetUp(link); err != nil {
		return err
	}
	pool := lb.Pool.Masked()
	r := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: &net.IPNet{IP: pool.Addr().AsSlice(), Mask: net.CIDRMask(pool.Bits(), pool.Addr().BitLen())},
		Scope: netlink.SCOPE_LINK, Protocol: lbRouteProto}
	if err := lb.nl.RouteReplace(r); err != nil {
		return fmt.Errorf("the pool's route to its sink: %w", err)
	}
	return nil
}

func lbRoute(a netip.Addr, hops []netip.Addr, src netip.Addr) netlink.Route {
	r := netlink.Route{Dst: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}, Protocol: lbRouteProto}
	if src.IsValid() {
		r.Src = src.AsSlice()
	}
	switch len(hops) {
	case 1:
		r.Gw = hops[0].AsSlice()
	default:
		for _, h := range hops {
			r.MultiPath = append(r.MultiPath, &netlink.NexthopInfo{Gw: h.AsSlice()})
		}
	}
	return r
}

// sameHops reports whether two load-balancer routes send traffic the same
// way.
func sameHops(a, b netlink.Route) bool {
	hops := func(r netlink.Route) []string {
		var out []string
		if r.Gw != nil {
			out = append(out, r.Gw.String())
		}
		for _, h := range r.MultiPath {
			out = append(out, h.Gw.String())
		}
		slices.Sort(out)
		return out
	}
	return a.Type == b.Type && a.Src.Equal(b.Src) && slices.Equal(hops(a), hops(b))
}
