package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/tcpreset"
	"github.com/weftnet/weft/proxy/ebpf"
	"github.com/weftnet/weft/proxy/healthcheck"
	"github.com/weftnet/weft/proxy/iptables"
	"github.com/weftnet/weft/proxy/ipvs"
	"github.com/weftnet/weft/proxy/model"
	"github.com/weftnet/weft/proxy/nftables"
	"github.com/weftnet/weft/proxy/userspace"
)

// Config is the proxy configuration shared by weft-proxy and weft-agent.
type Config struct {
	Mode              string // "iptables" (default), "nftables", "ipvs", "ebpf" or "userspace"
	NodeName, Zone    string
	NodeIPs           []netip.Addr
	NodePortAddresses []netip.Prefix // empty: every node IP
	ClusterCIDRs      []netip.Prefix
	MasqueradeAll     bool
	MasqueradeBit     int
	IPTablesVariant   string // "", "nft" or "legacy"
	MinSyncPeriod     time.Duration
	SyncPeriod        time.Duration
	HealthCheckPorts  bool
	Log               *slog.Logger
	// IPVS mode: the scheduler of every virtual server ("" is rr).
	IPVSScheduler string
	// eBPF mode: the cgroup v2 directory the socket programs attach to
	// (default: the cgroup v2 mount) and the bpffs directory of weft's
	// pinned maps and links (default ebpf.DefaultPinPath).
	CgroupRoot, BPFPinPath string
	// eBPF mode: the uplinks the per-packet programs run on (default: the
	// links holding NodePortIPs), the size of their conntrack maps, and
	// that of the services map, from which the other maps of Services and
	// endpoints get theirs (0: each from the node's memory).
	BPFDevices []string
	BPFCTMax   int
	BPFLBMax   int
	// eBPF mode: how flows from outside reach backends of other nodes
	// (--bpf-lb-mode: snat, dsr or hybrid; "" is snat).
	BPFLBMode string
	// BPFXDP: where the eBPF mode translates external traffic ahead of
	// tc (--bpf-xdp: off, auto, native, generic; "" is off).
	BPFXDP string
	// Userspace mode: its own settings (Listen set: rootless); the node's
	// (names, addresses, families, cluster CIDRs, iptables variant, log)
	// come from the fields above.
	Userspace userspace.Config
}

// NodePortIPs are the node addresses NodePorts answer on.
func (c Config) NodePortIPs() []netip.Addr {
	if len(c.NodePortAddresses) == 0 {
		return c.NodeIPs
	}
	var out []netip.Addr
	for _, ip := range c.NodeIPs {
		for _, p := range c.NodePortAddresses {
			if p.Contains(ip) {
				out = append(out, ip)
				break
			}
		}
	}
	return out
}

// Families are the IP families the node has addresses in (IPv4 by default).
func (c Config) Families() []int {
	has := map[int]bool{}
	for _, ip := range c.NodeIPs {
		if ip.Is4() {
			has[4] = true
		} else {
			has[6] = true
		}
	}
	var out []int
	for _, f := range []int{4, 6} {
		if has[f] {
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		out = []int{4}
	}
	return out
}

// Build returns the backend for c.Mode and a proxier driving it.
func Build(c Config) (*Proxier, Backend, error) {
	if c.MasqueradeBit < 0 || c.MasqueradeBit > 30 {
		return nil, nil, fmt.Errorf("--masquerade-bit: %d is outside 0..30", c.MasqueradeBit)
	}
	var b Backend
	switch c.Mode {
	case "iptables", "":
		b = iptables.New(iptables.Config{
			NodeName: c.NodeName, Zone: c.Zone, NodePortIPs: c.NodePortIPs(), ClusterCIDRs: c.ClusterCIDRs,
			MasqueradeAll: c.MasqueradeAll, MasqueradeBit: c.MasqueradeBit,
		}, c.Families(), iptables.Exec{Variant: c.IPTablesVariant})
	case "nftables":
		nb, err := nftables.New(nftables.Config{
			NodeName: c.NodeName, Zone: c.Zone, NodePortIPs: c.NodePortIPs(), ClusterCIDRs: c.ClusterCIDRs,
			MasqueradeAll: c.MasqueradeAll, MasqueradeBit: c.MasqueradeBit, Families: c.Families(),
		})
		if err != nil {
			return nil, nil, err
		}
		b = nb
	case "ipvs":
		ib, err := ipvs.New(ipvs.Config{
			NodeName: c.NodeName, Zone: c.Zone, NodePortIPs: c.NodePortIPs(), ClusterCIDRs: c.ClusterCIDRs,
			MasqueradeAll: c.MasqueradeAll, MasqueradeBit: c.MasqueradeBit, Scheduler: c.IPVSScheduler, Families: c.Families(),
		})
		if err != nil {
			return nil, nil, err
		}
		b = ib
	case "ebpf":
		eb, err := newEBPF(c)
		if err != nil {
			return nil, nil, err
		}
		b = eb
	case "userspace":
		ub, err := newUserspace(c)
		if err != nil {
			return nil, nil, err
		}
		b = ub
	default:
		return nil, nil, fmt.Errorf("--mode: %q is not supported (iptables, nftables, ipvs, ebpf, userspace)", c.Mode)
	}
	o := Options{NodeName: c.NodeName, Zone: c.Zone, MinSyncPeriod: c.MinSyncPeriod, SyncPeriod: c.SyncPeriod,
		Log: c.Log, FlushUDP: flushUDP}
	switch eb := b.(type) {
	case *ebpf.Backend:
		// The backend knows its connections: no conntrack entry shows the
		// Service a socket translated at connect time went through.
		o.ResetTCP = func(gone []GoneEndpoint) ResetResult {
			flows, err := ebpfFlows(eb, gone)
			return resetFlows(flows, err)
		}
	case *userspace.Backend:
		// The proxy holds both ends of each connection: it resets them.
		o.ResetTCP = func(gone []GoneEndpoint) ResetResult {
			f := newGoneFilter(gone)
			return ResetResult{Reset: eb.ResetTCP(func(port model.ServicePortName, ep netip.AddrPort) bool {
				return slices.ContainsFunc(f[ep], func(g GoneEndpoint) bool { return g.Service == port })
			})}
		}
	default:
		o.ResetTCP = resetConntrack
	}
	if c.Mode == "userspace" && c.Userspace.Listen.IsValid() {
		o.FlushUDP = nil // rootless: no conntrack entry is the proxy's
	} else {
		o.TakeOver = func(ctx context.Context) error { return takeOver(ctx, c) }
	}
	if c.HealthCheckPorts {
		o.Health = healthcheck.NewServer()
	}
	p := New(b, o)
	if c, ok := b.(prometheus.Collector); ok {
		p.metrics.Registry.MustRegister(c) // a backend's own metrics, such as the eBPF map fill levels
	}
	return p, b, nil
}

// modes are the service proxy modes, the default first.
var modes = []string{"iptables", "nftables", "ipvs", "ebpf", "userspace"}

// takeOver removes what the other modes left on the node: a node switched
// from one mode to another must keep no rules of the old one, which would
// go on translating new connections with a state nobody updates. It runs
// once this mode's first sync has programmed every Service, so that no
// moment is without rules; the connections the old mode translated go on,
// through their conntrack entries (iptables, nftables, IPVS) or, for the
// eBPF mode's sockets, connected to their backends at connect time. The
// eBPF mode is retired rather than removed (ebpf.Backend.Retire): its
// per-packet programs keep the connections from outside they translate
// until those are drained (drainEBPF, until ctx ends). A mode is cleaned
// up only where it left a mark of its own: IPVS its device, eBPF its pin
// directory on a bpffs.
func takeOver(ctx context.Context, c Config) error {
	current := c.Mode
	if current == "" {
		current = "iptables"
	}
	var errs []error
	for _, m := range modes {
		if m == current || !leftBehind(m, c) {
			continue
		}
		other := c
		other.Mode, other.HealthCheckPorts = m, false
		if m == "ebpf" {
			eb, err := ebpf.Retiring(ebpfConfig(other, ""))
			if err == nil {
				var since time.Time
				if since, err = eb.Retire(); err == nil {
					go drainEBPF(ctx, eb, since, c.Log)
				}
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("retiring the ebpf mode: %w", err))
			}
			continue
		}
		_, b, err := Build(other)
		if err != nil {
			errs = append(errs, fmt.Errorf("the %s mode's state: %w", m, err))
			continue
		}
		if err := b.Cleanup(); err != nil {
			errs = append(errs, fmt.Errorf("removing what the %s mode left: %w", m, err))
		}
	}
	return errors.Join(errs...)
}

// The retired eBPF mode is checked every EBPFDrainEvery (a variable for
// tests), and removed once its connections are drained or
// ebpfRetireGrace after it was first retired, whichever comes first.
var EBPFDrainEvery = 30 * time.Second

const ebpfRetireGrace = time.Hour

// drainEBPF removes the retired eBPF mode b once it is drained (see
// above), unless ctx ends first (the next start retires it again, with
// the same first time).
func drainEBPF(ctx context.Context, b *ebpf.Backend, since time.Time, log *slog.Logger) {
	t := time.NewTicker(EBPFDrainEvery)
	defer t.Stop()
	for {
		drained, err := b.Drained()
		if err != nil {
			log.Warn("reading the retired ebpf mode's connections", "err", err)
		}
		if drained || time.Since(since) > ebpfRetireGrace {
			if err := b.Cleanup(); err != nil {
				log.Warn("removing the retired ebpf mode", "err", err)
			} else {
				log.Info("removed the retired ebpf mode", "drained", drained, "retired", since)
			}
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// leftBehind reports whether mode m may have left state: the rule-based
// modes are asked (their cleanup finds nothing when they left nothing),
// the others only when their own mark is there.
func leftBehind(m string, c Config) bool {
	switch m {
	case "ipvs":
		_, err := netlink.LinkByName(ipvs.Device)
		return err == nil
	case "ebpf":
		pin := c.BPFPinPath
		if pin == "" {
			pin = ebpf.DefaultPinPath
		}
		var st unix.Statfs_t
		_, err := os.Stat(pin)
		return err == nil && unix.Statfs(filepath.Dir(pin), &st) == nil && st.Type == unix.BPF_FS_MAGIC
	}
	return true
}

// newEBPF builds the eBPF backend, filling in the default paths.
func newEBPF(c Config) (*ebpf.Backend, error) {
	root := c.CgroupRoot
	if root == "" {
		var err error
		if root, err = ebpf.CgroupV2Mount(); err != nil {
			return nil, fmt.Errorf("--cgroup-root: %w", err)
		}
	}
	return ebpf.New(ebpfConfig(c, root))
}

// ebpfConfig is the eBPF backend's configuration of c, with the cgroup
// root given and the default pin path.
func ebpfConfig(c Config, cgroupRoot string) ebpf.Config {
	pin := c.BPFPinPath
	if pin == "" {
		pin = ebpf.DefaultPinPath
	}
	return ebpf.Config{NodeName: c.NodeName, Zone: c.Zone, NodePortIPs: c.NodePortIPs(), CgroupRoot: cgroupRoot, PinPath: pin,
		Devices: c.BPFDevices, Families: c.Families(), MasqueradeBit: c.MasqueradeBit, IPTablesVariant: c.IPTablesVariant,
		CTMax: c.BPFCTMax, LBMax: c.BPFLBMax, LBMode: c.BPFLBMode, XDP: c.BPFXDP, Log: c.Log}
}

// ebpfFlows are the TCP connections the eBPF backend translated to gone
// endpoints through their Services, as their clients see them: a socket
// the socket programs connected is connected to the backend itself; a
// flow from outside addresses the frontend.
func ebpfFlows(b *ebpf.Backend, gone []GoneEndpoint) ([]tcpreset.Flow, error) {
	filter := newGoneFilter(gone)
	flows, err := b.TCPFlows(slices.Collect(maps.Keys(filter)))
	var out []tcpreset.Flow
	for _, f := range flows {
		if !filter.through(f.Backend, f.Frontend) {
			continue
		}
		server := f.Frontend
		if f.Socket {
			server = f.Backend
		}
		out = append(out, tcpreset.Flow{Client: f.Client, Server: server})
	}
	return out, err
}

// newUserspace builds the userspace backend with the node's settings.
func newUserspace(c Config) (*userspace.Backend, error) {
	u := c.Userspace
	u.NodeName, u.Zone, u.NodePortIPs, u.ClusterCIDRs = c.NodeName, c.Zone, c.NodePortIPs(), c.ClusterCIDRs
	u.Families, u.IPTablesVariant = c.Families(), c.IPTablesVariant
	if u.Log == nil {
		u.Log = c.Log
	}
	return userspace.New(u)
}

// Prepare starts, in the background, the start-up work of a backend that
// has some of its own (ebpf: loading and verifying the programs), so that
// it is paid while the sources list the cluster; the first sync still
// waits for the whole initial state, and does that work itself if it
// failed here.
func Prepare(b Backend, log *slog.Logger) {
	pr, ok := b.(interface{ Prepare() error })
	if !ok {
		return
	}
	go func() {
		if err := pr.Prepare(); err != nil {
			log.Warn("preparing the service proxy backend failed; the first sync tries again", "err", err)
		}
	}()
}
