package ipvs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	libipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/weftnet/weft/proxy/model"
)

// Device is the dummy link holding the virtual servers' addresses, so that
// traffic to them is delivered locally, where IPVS takes it.
const Device = "weft-ipvs0"

// DefaultGrace bounds how long a removed TCP or SCTP real server stays,
// with weight 0, for its connections to end.
const DefaultGrace = 5 * time.Minute

// Sysctls are what IPVS needs from the node's network namespace; New sets
// them. vs/conntrack keeps IPVS connections in conntrack, for the glue's
// masquerade; expire_nodest_conn ends a connection to a deleted real
// server on its next packet (rather than blackholing it);
// expire_quiescent_template lets ClientIP affinity leave a real server
// with weight 0 (a terminating one).
var Sysctls = map[string]string{
	"net/ipv4/vs/conntrack":                     "1",
	"net/ipv4/vs/expire_nodest_conn":            "1",
	"net/ipv4/vs/expire_quiescent_template":     "1",
	"net/ipv4/conf/" + Device + "/arp_ignore":   "1",
	"net/ipv4/conf/" + Device + "/arp_announce": "2",
}

// bridgeSysctls, set when br_netfilter is loaded, make bridged traffic
// (a pod answering a pod on the same bridge) pass the netfilter hooks, where
// IPVS rewrites the replies of its connections.
var bridgeSysctls = map[string]string{
	"net/bridge/bridge-nf-call-iptables":  "1",
	"net/bridge/bridge-nf-call-ip6tables": "1",
}

// Stats describe the last sync.
type Stats struct {
	// NetlinkOps are the IPVS netlink requests the sync made.
	NetlinkOps int
	// Elements are the glue set elements added or deleted.
	Elements int
	Servers  int
}

// Backend is the IPVS service proxy backend: a virtual server per service
// entry point (ClusterIP, NodePort on each node IP, externalIP,
// LoadBalancer IP), its addresses on Device, and a constant nftables table
// of glue rules whose sets follow the services.
type Backend struct {
	cfg  Config
	ipvs *countingKernel
	nft  knftables.Interface

	mu          sync.Mutex
	applied     map[VSKey]*appliedVS // nil: read the kernel first
	addrs       map[netip.Addr]bool  // on Device, as applied
	sets        map[string]map[string][]string
	terminating map[destKey]time.Time
	reaping     bool
	// Grace bounds the termination of a removed real server.
	Grace time.Duration
	// LastStats are the stats of the last sync.
	LastStats Stats
}

// New checks that the kernel has IPVS and the configured scheduler, sets
// the sysctls IPVS needs and returns a backend.
func New(cfg Config) (*Backend, error) {
	// moby/ipvs does not fail without IPVS: look for it first.
	if _, err := os.Stat("/proc/net/ip_vs"); err != nil {
		return nil, fmt.Errorf("ipvs mode: the kernel has no IPVS (/proc/net/ip_vs is missing): load the ip_vs module or choose another proxy mode: %w", err)
	}
	if err := CheckScheduler(cfg.Scheduler); err != nil {
		return nil, err
	}
	h, err := libipvs.New("")
	if err != nil {
		return nil, fmt.Errorf("ipvs mode: opening IPVS netlink: %w", err)
	}
	nft, err := knftables.New(knftables.InetFamily, TableName)
	if err != nil {
		return nil, fmt.Errorf("ipvs mode needs the nft tool for its glue rules: %w", err)
	}
	return NewWith(cfg, h, nft), nil
}

// NewWith returns a backend on k and nft (fakes in tests).
func NewWith(cfg Config, k Kernel, nft knftables.Interface) *Backend {
	return &Backend{cfg: cfg, ipvs: &countingKernel{Kernel: k}, nft: nft, terminating: map[destKey]time.Time{}, Grace: DefaultGrace}
}

// CheckScheduler rejects a scheduler weft does not know, or whose module
// the kernel does not have; the error names the flag.
func CheckScheduler(s string) error {
	if s == "" {
		return nil
	}
	if !slices.Contains(Schedulers, s) {
		return fmt.Errorf("--ipvs-scheduler: %q is not an IPVS scheduler (%s)", s, strings.Join(Schedulers, ", "))
	}
	if _, err := os.Stat("/sys/module/ip_vs_" + s); err == nil {
		return nil
	}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return err
	}
	dir := filepath.Join("/lib/modules", unix.ByteSliceToString(uts.Release[:]))
	for _, f := range []string{"modules.dep", "modules.builtin"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err == nil && strings.Contains(string(b), "/ip_vs_"+s+".ko") {
			return nil
		}
	}
	return fmt.Errorf("--ipvs-scheduler: the kernel has no %q scheduler (no module ip_vs_%s loaded or in %s)", s, s, dir)
}

// setSysctls writes Sysctls in the current network namespace.
func setSysctls() error {
	all := maps.Clone(Sysctls)
	if _, err := os.Stat("/proc/sys/net/bridge"); err == nil {
		maps.Copy(all, bridgeSysctls)
	}
	for k, v := range all {
		p := filepath.Join("/proc/sys", k)
		if b, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(b)) == v {
			continue
		}
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			return fmt.Errorf("ipvs mode: setting sysctl %s=%s: %w", strings.ReplaceAll(k, "/", "."), v, err)
		}
	}
	return nil
}

// Dump renders st as a readable list of virtual servers and glue set
// elements (for --dry-run). It touches nothing.
func (b *Backend) Dump(st model.State) (string, error) {
	d := Render(b.cfg, st)
	var sb strings.Builder
	keys := make([]VSKey, 0, len(d.Servers))
	for k := range d.Servers {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, compareKeys)
	for _, k := range keys {
		vs := d.Servers[k]
		fmt.Fprintf(&sb, "%s %s persistent=%d service=%s\n", k, vs.Scheduler, vs.Timeout, vs.Service)
		for _, dst := range vs.Dests {
			fmt.Fprintf(&sb, "  -> %s\n", dst)
		}
	}
	fmt.Fprintf(&sb, "%s addresses: %v\n", Device, d.Addrs)
	sets := glueSets(d)
	names := make([]string, 0, len(sets))
	for n := range sets {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		var elems []string
		for k := range sets[n] {
			elems = append(elems, k)
		}
		slices.Sort(elems)
		fmt.Fprintf(&sb, "set %s: %s\n", n, strings.Join(elems, ", "))
	}
	return sb.String(), nil
}

// Sync makes IPVS, Device's addresses and the glue sets match st; full (or
// the first sync) reads the kernel's state first, so a restarted proxy
// changes only what differs.
func (b *Backend) Sync(st model.State, full bool) error {
	d := Render(b.cfg, st)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ipvs.ops = 0
	stats := Stats{Servers: len(d.Servers)}
	defer func() { stats.NetlinkOps = b.ipvs.ops; b.LastStats = stats }()
	if full || b.applied == nil {
		b.applied, b.addrs, b.sets = nil, nil, nil
		if err := b.readState(d); err != nil {
			return err
		}
		if err := setSysctls(); err != nil {
			return err
		}
	}
	// Glue first: a new entry's drops and masquerade hold before its
	// address takes traffic.
	n, err := b.syncGlue(d)
	stats.Elements = n
	if err != nil {
		return err
	}
	p := b.plan()
	if err := p.apply(d.Servers); err != nil {
		return err
	}
	if err := b.syncAddrs(d.Addrs); err != nil {
		return err
	}
	if err := p.reap(); err != nil {
		return err
	}
	b.startReaper()
	return nil
}

func (b *Backend) plan() *ipvsPlan {
	return &ipvsPlan{k: b.ipvs, applied: b.applied, terminating: b.terminating, grace: b.Grace, now: time.Now()}
}

// readState reads the kernel's virtual servers and Device's addresses.
func (b *Backend) readState(d *Desired) error {
	link, err := ensureDevice()
	if err != nil {
		return err
	}
	list, err := netlink.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("listing the addresses of %s: %w", Device, err)
	}
	b.addrs = map[netip.Addr]bool{}
	for _, a := range list {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && !ip.Unmap().IsLinkLocalUnicast() {
			b.addrs[ip.Unmap()] = true
		}
	}
	owned := func(a netip.Addr) bool {
		return b.addrs[a] || slices.Contains(d.Addrs, a) || slices.Contains(b.cfg.NodePortIPs, a)
	}
	applied, err := readKernel(b.ipvs, owned)
	if err != nil {
		return err
	}
	b.applied = applied
	for key, a := range applied {
		for dest, w := range a.dests {
			if _, ok := b.terminating[destKey{key, dest}]; w == 0 && !ok {
				b.terminating[destKey{key, dest}] = time.Now().Add(b.Grace)
			}
		}
	}
	return nil
}

// syncGlue writes the glue table (whole on the first or a full sync, then
// only the set elements that changed) in one transaction.
func (b *Backend) syncGlue(d *Desired) (int, error) {
	want := glueSets(d)
	tx := b.nft.NewTransaction()
	if b.sets == nil {
		glueTable(tx, b.cfg)
		for set := range want {
			tx.Flush(&knftables.Set{Name: set})
		}
	}
	n := glueElements(tx, b.sets, want)
	if tx.NumOperations() == 0 {
		return 0, nil
	}
	if err := b.nft.Run(context.Background(), tx); err != nil {
		b.sets = nil
		return n, fmt.Errorf("ipvs mode: writing nftables table inet %s: %w", TableName, err)
	}
	b.sets = want
	return n, nil
}

// ensureDevice returns Device, creating it (up) if missing.
func ensureDevice() (netlink.Link, error) {
	link, err := netlink.LinkByName(Device)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return nil, fmt.Errorf("looking up %s: %w", Device, err)
		}
		if err := netlink.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: Device}}); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("creating dummy link %s: %w", Device, err)
		}
		if link, err = netlink.LinkByName(Device); err != nil {
			return nil, fmt.Errorf("looking up %s: %w", Device, err)
		}
	}
	if link.Attrs().Flags&unix.IFF_UP == 0 {
		if err := netlink.LinkSetUp(link); err != nil {
			return nil, fmt.Errorf("setting %s up: %w", Device, err)
		}
	}
	return link, nil
}

// syncAddrs makes Device hold exactly want.
func (b *Backend) syncAddrs(want []netip.Addr) error {
	link, err := netlink.LinkByName(Device)
	if err != nil {
		b.applied = nil // recreate on the next sync
		return fmt.Errorf("looking up %s: %w", Device, err)
	}
	keep := map[netip.Addr]bool{}
	for _, ip := range want {
		keep[ip] = true
		if b.addrs[ip] {
			continue
		}
		p := prefixOf(ip)
		a := &netlink.Addr{IPNet: netlinkNet(p)}
		if ip.Is6() {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := netlink.AddrReplace(link, a); err != nil {
			return fmt.Errorf("adding %s to %s: %w", p, Device, err)
		}
		b.addrs[ip] = true
	}
	for ip := range b.addrs {
		if keep[ip] {
			continue
		}
		if err := netlink.AddrDel(link, &netlink.Addr{IPNet: netlinkNet(prefixOf(ip))}); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("removing %s from %s: %w", ip, Device, err)
		}
		delete(b.addrs, ip)
	}
	return nil
}

func netlinkNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// startReaper runs reap every second while real servers are terminating.
func (b *Backend) startReaper() {
	if b.reaping || len(b.terminating) == 0 {
		return
	}
	b.reaping = true
	go func() {
		for {
			time.Sleep(time.Second)
			b.mu.Lock()
			if b.applied != nil {
				_ = b.plan().reap() // a failure is retried on the next tick or sync
			}
			if len(b.terminating) == 0 || b.applied == nil {
				b.reaping = false
				b.mu.Unlock()
				return
			}
			b.mu.Unlock()
		}
	}()
}

// Cleanup deletes weft's virtual servers (those on Device's addresses and
// the NodePort addresses), Device and the glue table.
func (b *Backend) Cleanup() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var errs []error
	addrs := map[netip.Addr]bool{}
	link, err := netlink.LinkByName(Device)
	if err == nil {
		list, _ := netlink.AddrList(link, netlink.FAMILY_ALL)
		for _, a := range list {
			if ip, ok := netip.AddrFromSlice(a.IP); ok {
				addrs[ip.Unmap()] = true
			}
		}
	}
	owned, err := readKernel(b.ipvs, func(a netip.Addr) bool { return addrs[a] || slices.Contains(b.cfg.NodePortIPs, a) })
	errs = append(errs, err)
	for key, a := range owned {
		if err := b.ipvs.DelService(toService(key, a.vs.Scheduler, a.vs.Timeout)); err != nil {
			errs = append(errs, fmt.Errorf("deleting IPVS virtual server %s: %w", key, err))
		}
	}
	if link != nil {
		if err := netlink.LinkDel(link); err != nil {
			errs = append(errs, fmt.Errorf("deleting %s: %w", Device, err))
		}
	}
	tx := b.nft.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Delete(&knftables.Table{})
	if err := b.nft.Run(context.Background(), tx); err != nil {
		errs = append(errs, fmt.Errorf("deleting table inet %s: %w", TableName, err))
	}
	b.applied, b.addrs, b.sets = nil, nil, nil
	clear(b.terminating)
	return errors.Join(errs...)
}
