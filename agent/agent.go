// Package agent is weft-agent's node networking loop: from the Node objects
// it computes the node's CNI configuration, masquerade rules and cross-node
// routes (host-gw or VXLAN; BGP in bgp.go) and applies them, on every change and on a
// periodic resync that repairs drift.
package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/vishvananda/netlink"

	"github.com/weftnet/weft/cni"
	"github.com/weftnet/weft/internal/fsutil"
	"github.com/weftnet/weft/internal/nlutil"
	"github.com/weftnet/weft/routing"
	"github.com/weftnet/weft/routing/bgp"
	"github.com/weftnet/weft/routing/wireguard"
)

// Options configure the agent.
type Options struct {
	NodeName string
	Routing  routing.Mode
	// IPIPCrossSubnet: in ipip mode, encapsulate only to nodes outside the
	// node's underlay subnet.
	IPIPCrossSubnet bool
	ClusterCIDRs    []netip.Prefix
	CNIConfDir      string
	IPAMDataDir     string
	Bridge          string
	MTU             int // 0: derived from the underlay link and the routing mode
	Resync          time.Duration
	// Dataplane is where the agent's own rules live: DataplaneIPTables
	// (default) or DataplaneNFTables (see nftables.go).
	Dataplane string
	// Encryption of pod traffic between nodes (encryption.go).
	Encryption EncryptionOptions
	// PathMTUPort is where the agent answers and sends path MTU probes
	// (pathmtu.go); 0: neither.
	PathMTUPort int
	Log         *slog.Logger
}

// Agent programs one node.
type Agent struct {
	opts     Options
	client   kubernetes.Interface
	nodes    listers.NodeLister
	trigger  chan struct{}
	routes   *routing.Reconciler
	metrics  *metrics
	lastGood atomic.Int64 // unix nanos of the last fully successful sync
	masq     string       // last applied masquerade payload
	ready    bool         // NetworkUnavailable cleared
	enc      *encryption  // --encryption wireguard, once set up
	// plainChecked: without encryption, a tunnel left by an earlier
	// configuration has been removed.
	plainChecked bool
}

// New returns an agent using client.
func New(client kubernetes.Interface, o Options) *Agent {
	if o.Resync == 0 {
		o.Resync = 30 * time.Second
	}
	if o.Bridge == "" {
		o.Bridge = cni.DefaultBridge
	}
	return &Agent{opts: o, client: client, trigger: make(chan struct{}, 1), routes: routing.NewReconciler(), metrics: newMetrics()}
}

// Run watches Nodes and syncs the node until ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	factory := informers.NewSharedInformerFactory(a.client, 0)
	inf := factory.Core().V1().Nodes()
	a.nodes = inf.Lister()
	poke := func(any) { a.poke() }
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: poke, UpdateFunc: func(_, n any) { a.poke() }, DeleteFunc: poke,
	}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		return ctx.Err()
	}
	if a.opts.PathMTUPort > 0 {
		go func() {
			if err := a.runPathMTU(ctx, a.opts.PathMTUPort); err != nil {
				a.opts.Log.Error("path MTU measurement stopped", "err", err)
			}
		}()
	}
	tick := time.NewTicker(a.opts.Resync)
	defer tick.Stop()
	a.poke()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-a.trigger:
		case <-tick.C:
		}
		start := time.Now()
		err := a.sync(ctx)
		a.metrics.observe(time.Since(start), err)
		if err != nil {
			a.opts.Log.Error("sync failed", "node", a.opts.NodeName, "err", err)
			continue
		}
		a.lastGood.Store(time.Now().UnixNano())
	}
}

func (a *Agent) poke() {
	select {
	case a.trigger <- struct{}{}:
	default:
	}
}

// Healthy reports whether a sync succeeded within three resync periods.
func (a *Agent) Healthy() bool {
	last := a.lastGood.Load()
	return last != 0 && time.Since(time.Unix(0, last)) < 3*a.opts.Resync
}

func (a *Agent) sync(ctx context.Context) error {
	self, err := a.nodes.Get(a.opts.NodeName)
	if err != nil {
		return fmt.Errorf("own node %s: %w", a.opts.NodeName, err)
	}
	me, errs := RoutingNode(self)
	for _, e := range errs {
		a.opts.Log.Warn("skipping field of own node", "node", e.Node, "field", e.Field, "err", e.Err)
	}
	if len(me.PodCIDRs) == 0 {
		a.opts.Log.Info("waiting for a podCIDR", "node", a.opts.NodeName)
		return nil
	}
	mtu, err := a.mtu(me)
	if err != nil {
		return err
	}
	all, nodes, err := a.clusterNodes()
	if err != nil {
		return err
	}
	// The tunnel (and strict mode's blackholes) come before the CNI
	// configuration lets pods start.
	if err := a.syncEncryptionMode(ctx, self, me, all, nodes); err != nil {
		return err
	}
	if err := a.writeCNIConfig(me.PodCIDRs, mtu); err != nil {
		return err
	}
	if err := cni.EnsureBridge(a.opts.Bridge, mtu, Gateways(me.PodCIDRs)); err != nil {
		return fmt.Errorf("bridge %s: %w", a.opts.Bridge, err)
	}
	if err := a.ensureMasquerade(); err != nil {
		return err
	}
	if a.opts.Routing == routing.ModeVXLAN {
		if err := a.publishVTEPMAC(ctx, self); err != nil {
			return err
		}
	}
	if err := a.syncRoutes(me, nodes); err != nil {
		return err
	}
	if !a.ready {
		if err := a.clearNetworkUnavailable(ctx); err != nil {
			return err
		}
		a.ready = true
	}
	return nil
}

// clusterNodes lists the Nodes and converts each once for routing and
// encryption (nodes[i] is all[i]), logging the fields left out.
func (a *Agent) clusterNodes() (all []*corev1.Node, nodes []routing.Node, err error) {
	all, err = a.nodes.List(labels.Everything())
	if err != nil {
		return nil, nil, err
	}
	nodes = make([]routing.Node, 0, len(all))
	for _, n := range all {
		rn, errs := RoutingNode(n)
		for _, e := range errs {
			a.opts.Log.Warn("skipping field of node", "node", e.Node, "field", e.Field, "err", e.Err)
		}
		nodes = append(nodes, rn)
	}
	return all, nodes, nil
}

func (a *Agent) syncRoutes(me routing.Node, nodes []routing.Node) error {
	if a.opts.Routing == bgp.Mode {
		// BGP installs the routes (agent/bgp.go); host-gw's and VXLAN's
		// are left from an earlier mode, if any.
		if err := a.routes.Cleanup(); err != nil {
			return fmt.Errorf("removing host-gw/vxlan routes in bgp mode: %w", err)
		}
		return nil
	}
	cfg := routing.Config{Mode: a.opts.Routing, Self: me}
	if a.opts.Routing == routing.ModeIPIP && a.opts.IPIPCrossSubnet {
		cfg.IPIP.CrossSubnet = true
		var err error
		if cfg.IPIP.Subnet, err = underlaySubnet(me); err != nil {
			return err
		}
	}
	desired, nerrs := routing.Compute(cfg, nodes)
	for _, e := range nerrs {
		a.opts.Log.Warn("skipping node", "node", e.Node, "field", e.Field, "err", e.Err)
	}
	a.metrics.routes.Set(float64(len(desired.Routes)))
	if err := a.routes.Apply(desired); err != nil {
		return fmt.Errorf("routes: %w", err)
	}
	return nil
}

// mtu is the pods' MTU: the underlay link's minus the encapsulation.
func (a *Agent) mtu(me routing.Node) (int, error) {
	return podMTU(a.opts.MTU, a.opts.Routing, a.opts.Encryption.Mode, me)
}

// podMTU is the pods' MTU: fixed if set, else the underlay link's minus
// the overhead of the routing mode and encryption (Overhead).
func podMTU(fixed int, mode routing.Mode, encryption string, me routing.Node) (int, error) {
	if fixed > 0 {
		return fixed, nil
	}
	underlay, ok := underlayAddr(me)
	if !ok {
		return 0, fmt.Errorf("own node %s has no InternalIP", me.Name)
	}
	link, err := linkWithAddr(underlay)
	if err != nil {
		return 0, err
	}
	return link.Attrs().MTU - Overhead(mode, encryption, underlay.Is6()), nil
}

// Overhead is what the routing mode and encryption add to a pod packet on
// the underlay of the given family. With WireGuard, pod traffic to a node
// with a tunnel takes the tunnel and to one without it the routing mode's
// path, so the larger of the two counts.
func Overhead(mode routing.Mode, encryption string, ipv6Underlay bool) int {
	o := 0
	switch mode {
	case routing.ModeVXLAN:
		o = routing.OverheadIPv4
		if ipv6Underlay {
			o = routing.OverheadIPv6
		}
	case routing.ModeIPIP:
		o = routing.OverheadIPIP
	}
	if encryption == EncryptionWireGuard {
		w := wireguard.OverheadIPv4
		if ipv6Underlay {
			w = wireguard.OverheadIPv6
		}
		o = max(o, w)
	}
	return o
}

// underlayAddr is the node's address between nodes: IPv4 when the node
// has an IPv4 InternalIP, as in routing.Compute.
func underlayAddr(me routing.Node) (netip.Addr, bool) {
	if len(me.InternalIPs) == 0 {
		return netip.Addr{}, false
	}
	underlay := me.InternalIPs[0]
	for _, ip := range me.InternalIPs {
		if ip.Is4() {
			underlay = ip
		}
	}
	return underlay, true
}

// underlaySubnet is the prefix of the node's IPv4 underlay address on its
// link.
func underlaySubnet(me routing.Node) (netip.Prefix, error) {
	ip, ok := sameFamilyAddr(me.InternalIPs, true)
	if !ok {
		return netip.Prefix{}, fmt.Errorf("own node %s has no IPv4 InternalIP", me.Name)
	}
	addrs, err := nlutil.Dump("addresses", func() ([]netlink.Addr, error) { return netlink.AddrList(nil, netlink.FAMILY_V4) })
	if err != nil {
		return netip.Prefix{}, err
	}
	for _, ad := range addrs {
		if ad.IP.Equal(net.IP(ip.AsSlice())) {
			ones, _ := ad.Mask.Size()
			return netip.PrefixFrom(ip, ones).Masked(), nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("no link carries the node address %s", ip)
}

func linkWithAddr(ip netip.Addr) (netlink.Link, error) {
	addrs, err := nlutil.Dump("addresses", func() ([]netlink.Addr, error) { return netlink.AddrList(nil, netlink.FAMILY_ALL) })
	if err != nil {
		return nil, err
	}
	for _, ad := range addrs {
		if ad.IP.Equal(net.IP(ip.AsSlice())) {
			return netlink.LinkByIndex(ad.LinkIndex)
		}
	}
	return nil, fmt.Errorf("no link carries the node address %s", ip)
}

// writeCNIConfig writes the conflist atomically, only when it changed.
func (a *Agent) writeCNIConfig(cidrs []netip.Prefix, mtu int) error {
	data, err := RenderConflist(CNIConfig{Bridge: a.opts.Bridge, MTU: mtu, PodCIDRs: cidrs, DataDir: a.opts.IPAMDataDir})
	if err != nil {
		return err
	}
	path := filepath.Join(a.opts.CNIConfDir, conflistName)
	if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, data) {
		return nil
	}
	if err := os.MkdirAll(a.opts.CNIConfDir, 0o755); err != nil {
		return err
	}
	if err := fsutil.WriteFileAtomic(path, data, 0o644); err != nil {
		return err
	}
	a.opts.Log.Info("wrote CNI configuration", "path", path, "podCIDRs", cidrs, "mtu", mtu)
	return nil
}

// ensureMasquerade installs the agent's chains and the jumps to them. The
// chains are rewritten on every sync (cheap, and it repairs drift); the
// jumps are added only when missing. Nothing else is touched.
func (a *Agent) ensureMasquerade() error {
	var v4 []netip.Prefix
	for _, c := range a.opts.ClusterCIDRs {
		if c.Addr().Is4() {
			v4 = append(v4, c)
		}
	}
	if len(v4) == 0 {
		return nil
	}
	if a.opts.Dataplane == DataplaneNFTables {
		return a.ensureMasqueradeNFT(v4)
	}
	payload := MasqueradeRules(v4)
	cmd := exec.Command("iptables-restore", "--noflush", "-w", "5")
	cmd.Stdin = bytes.NewReader([]byte(payload))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("iptables-restore of the masquerade chains: %w: %s", err, out)
	}
	for _, j := range [][]string{
		{"-t", "nat", "POSTROUTING", "-m", "comment", "--comment", "weft masquerade", "-j", "WEFT-POSTROUTING"},
		{"-t", "filter", "FORWARD", "-m", "comment", "--comment", "weft forward", "-j", "WEFT-FORWARD"},
	} {
		check := append([]string{"-w", "5", j[0], j[1], "-C"}, j[2:]...)
		if exec.Command("iptables", check...).Run() == nil {
			continue
		}
		add := append([]string{"-w", "5", j[0], j[1], "-A"}, j[2:]...)
		if out, err := exec.Command("iptables", add...).CombinedOutput(); err != nil {
			return fmt.Errorf("adding the jump to %s: %w: %s", j[len(j)-1], err, out)
		}
	}
	if payload != a.masq {
		a.opts.Log.Info("masquerade rules applied", "clusterCIDRs", v4)
		a.masq = payload
	}
	return nil
}

// conflistName is the CNI configuration file the agent writes.
const conflistName = "10-weft.conflist"

// Cleanup removes what the agent installed on the node: its routes and
// rules, and, as an uninstall must, the CNI configuration it wrote, the
// pods' bridge and the IPAM state (the node's pods lose their network).
func (a *Agent) Cleanup() error {
	var errs []error
	if err := a.routes.Cleanup(); err != nil {
		errs = append(errs, err)
	}
	if a.enc != nil {
		a.enc.rec.Close()
	}
	if err := wireguard.Cleanup("", nil); err != nil {
		errs = append(errs, fmt.Errorf("wireguard: %w", err))
	}
	if err := (bgp.FIB{}).Cleanup(); err != nil {
		errs = append(errs, fmt.Errorf("bgp routes: %w", err))
	}
	if err := os.Remove(filepath.Join(a.opts.CNIConfDir, conflistName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(a.opts.IPAMDataDir); err != nil {
		errs = append(errs, err)
	}
	if l, err := netlink.LinkByName(a.opts.Bridge); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("deleting bridge %s: %w", a.opts.Bridge, err))
		}
	}
	if a.opts.Dataplane == DataplaneNFTables {
		return errors.Join(append(errs, a.cleanupMasqueradeNFT())...)
	}
	for _, j := range [][]string{{"nat", "POSTROUTING", "weft masquerade", "WEFT-POSTROUTING"}, {"filter", "FORWARD", "weft forward", "WEFT-FORWARD"}} {
		_ = exec.Command("iptables", "-w", "5", "-t", j[0], "-D", j[1], "-m", "comment", "--comment", j[2], "-j", j[3]).Run()
		_ = exec.Command("iptables", "-w", "5", "-t", j[0], "-F", j[3]).Run()
		_ = exec.Command("iptables", "-w", "5", "-t", j[0], "-X", j[3]).Run()
	}
	return errors.Join(errs...)
}
