package ebpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/routing"
)

// tcxPinPrefix starts the pin name of a tcx link: "tcx_<ifindex>" on a
// device's ingress, "tcx_egress_<ifindex>" on its egress.
const tcxPinPrefix = "tcx_"

// clsPriority and clsHandle identify weft's cls_bpf filters on a clsact
// ingress or egress (kernels without tcx); the filter's name is its
// program's.
const (
	clsPriority = 0x7765
	clsHandle   = 0x7765
)

// tcHook is one side of a device a per-packet program runs on.
type tcHook struct {
	device string
	egress bool
}

// tcAttached is a per-packet program on one device's ingress or egress.
type tcAttached struct {
	ifindex int
	prog    *ebpf.Program
	link    link.Link // nil for a cls_bpf filter
}

// tcPinName is the pin name of weft's tcx link on one side of device idx.
func tcPinName(idx int, egress bool) string {
	if egress {
		return tcxPinPrefix + "egress_" + strconv.Itoa(idx)
	}
	return tcxPinPrefix + strconv.Itoa(idx)
}

// devicePrograms returns the program each side of each uplink should run:
// weft_nodeport on the ingress (DNAT toward a backend), weft_reply on the
// egress (the replies, after conntrack, back to the frontend). An uplink
// that is a Linux bridge runs weft_nodeport_port on the ingress of each
// of its ports instead (see bpf/nodeport.c); ports maps each such port's
// ifindex to the bridge's MAC address. An uplink that does not exist is
// an error.
func (b *Backend) devicePrograms() (want map[tcHook]*ebpf.Program, ports map[uint32]nodeportBridgePort, err error) {
	want, ports = map[tcHook]*ebpf.Program{}, map[uint32]nodeportBridgePort{}
	var errs []error
	var all []netlink.Link
	for _, d := range b.uplinks {
		l, err := netlink.LinkByName(d)
		if err != nil {
			errs = append(errs, fmt.Errorf("device %s: %w", d, err))
			continue
		}
		want[tcHook{d, true}] = b.np.WeftReply
		if _, ok := l.(*netlink.Bridge); !ok {
			want[tcHook{d, false}] = b.np.WeftNodeport
			continue
		}
		if all == nil {
			if all, err = netlink.LinkList(); err != nil {
				return nil, nil, fmt.Errorf("listing links for the ports of bridge %s: %w", d, err)
			}
		}
		mac := l.Attrs().HardwareAddr
		if len(mac) != 6 {
			errs = append(errs, fmt.Errorf("bridge %s: MAC address %q is not 6 bytes", d, mac))
			continue
		}
		for _, p := range all {
			if p.Attrs().MasterIndex != l.Attrs().Index {
				continue
			}
			want[tcHook{p.Attrs().Name, false}] = b.np.WeftNodeportPort
			ports[uint32(p.Attrs().Index)] = nodeportBridgePort{MacHi: binary.NativeEndian.Uint32(mac[:4]), MacLo: binary.NativeEndian.Uint16(mac[4:])}
		}
	}
	// The VXLAN device: the packets other nodes send to this node's
	// backends with direct server return arrive there decapsulated, with
	// weft's option to strip (weft_nodeport's receive side; replies leave
	// by the route to the client, an uplink). A device created later is
	// taken by a later sync.
	// In snat mode nothing runs there (no node sends DSR packets).
	if tun := b.cfg.tunnelDevice(); b.cfg.lbMode() != LBModeSNAT && !slices.Contains(b.uplinks, tun) {
		if l, err := netlink.LinkByName(tun); err == nil {
			if _, ok := l.(*netlink.Vxlan); ok {
				want[tcHook{tun, false}] = b.np.WeftNodeport
				// A client's packet arrives there while the route back
				// to it is another device: strict reverse-path
				// filtering would drop it. Failing to set it is no
				// error of the sync (the agent's container may see
				// /proc/sys read-only): a warning, once, says what to
				// set.
				if err := looseRPFilter(tun); err != nil && !b.rpWarned {
					b.rpWarned = true
					b.cfg.Log.Warn("direct server return over the VXLAN device needs its reverse-path filter loose or off: set net.ipv4.conf."+strings.ReplaceAll(tun, ".", "/")+".rp_filter=2 (or net.ipv4.conf.default.rp_filter=2 before the device is made)", "err", err)
				}
			}
		}
	}
	return want, ports, errors.Join(errs...)
}

// tunnelDevice is the VXLAN device of the node.
func (c Config) tunnelDevice() string {
	if c.TunnelDevice != "" {
		return c.TunnelDevice
	}
	return routing.DefaultDevice
}

// looseRPFilter makes dev's reverse-path filtering loose where it is
// strict: the kernel applies the larger of the device's value and
// "all"'s, so where that is 1 (strict) the device gets 2 (loose), which
// wins over strict in "all" (0 on the device would not); where it is 0
// (off) or 2 nothing is written.
func looseRPFilter(dev string) error {
	read := func(path string) (string, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", fmt.Errorf("reading %s: %w", path, err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	path := filepath.Join("/proc/sys/net/ipv4/conf", dev, "rp_filter")
	cur, err := read(path)
	if err != nil {
		return err
	}
	all, err := read("/proc/sys/net/ipv4/conf/all/rp_filter")
	if err != nil {
		return err
	}
	if max(cur, all) != "1" {
		return nil
	}
	if err := os.WriteFile(path, []byte("2\n"), 0o644); err != nil {
		return fmt.Errorf("setting %s to loose: %w", path, err)
	}
	return nil
}

// attachDevices puts the per-packet programs on every uplink side that
// should run one and does not yet (a device created again since the last
// sync, a new port of a bridge uplink), and takes them off the sides that
// no longer should (a port that left its bridge).
func (b *Backend) attachDevices() error {
	want, ports, err := b.devicePrograms()
	errs := []error{err}
	// The ports' map first: a port's program passes every frame of a port
	// it does not find there.
	if err := syncBridgePorts(b.np.WeftBridgePorts, ports); err != nil {
		errs = append(errs, err)
	}
	// Only DSR reads weft_no_dsr: in snat mode a sync lists no links for it.
	if b.cfg.lbMode() != LBModeSNAT {
		if err := syncNoDSR(b.np.WeftNoDsr); err != nil {
			errs = append(errs, err)
		}
	}
	for h, prog := range want {
		l, err := netlink.LinkByName(h.device)
		if err != nil {
			errs = append(errs, fmt.Errorf("device %s: %w", h.device, err))
			continue
		}
		idx := l.Attrs().Index
		if cur, ok := b.tc[h]; ok && cur.ifindex == idx && cur.prog == prog {
			continue
		}
		a, err := b.attachTC(idx, h.egress, prog)
		if err != nil {
			errs = append(errs, fmt.Errorf("attaching %s to %s: %w", progName(prog), h.device, err))
			continue
		}
		if cur, ok := b.tc[h]; ok && cur.link != nil && cur.ifindex != idx {
			_ = cur.link.Close()
		}
		b.tc[h] = a
	}
	for h, a := range b.tc {
		if _, ok := want[h]; ok {
			continue
		}
		if err := a.detach(h.egress); err != nil {
			errs = append(errs, fmt.Errorf("taking %s off %s: %w", progName(a.prog), h, err))
			continue
		}
		delete(b.tc, h)
	}
	return errors.Join(errs...)
}

// syncNoDSR makes m (weft_no_dsr) hold the devices without Ethernet
// headers (WireGuard, IPIP, ...): a DSR packet routed out of one would
// reach a node whose receive side does not run there, so such flows are
// masqueraded (bpf/nodeport.c).
func syncNoDSR(m *ebpf.Map) error {
	links, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("listing links for weft_no_dsr: %w", err)
	}
	want := map[uint32]bool{}
	var errs []error
	for _, l := range links {
		if a := l.Attrs(); a.EncapType != "ether" && a.EncapType != "loopback" {
			want[uint32(a.Index)] = true
			if err := m.Put(uint32(a.Index), uint8(1)); err != nil {
				errs = append(errs, fmt.Errorf("weft_no_dsr %s: %w", a.Name, err))
			}
		}
	}
	var (
		idx   uint32
		v     uint8
		stale []uint32
	)
	for it := m.Iterate(); it.Next(&idx, &v); {
		if !want[idx] {
			stale = append(stale, idx)
		}
	}
	for _, idx := range stale {
		if err := m.Delete(idx); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("weft_no_dsr %d: %w", idx, err))
		}
	}
	return errors.Join(errs...)
}

// syncBridgePorts makes m hold ports, and nothing else.
func syncBridgePorts(m *ebpf.Map, ports map[uint32]nodeportBridgePort) error {
	var errs []error
	for idx, p := range ports {
		if err := m.Put(idx, p); err != nil {
			errs = append(errs, fmt.Errorf("bridge port %d: %w", idx, err))
		}
	}
	var (
		idx   uint32
		p     nodeportBridgePort
		stale []uint32
	)
	for it := m.Iterate(); it.Next(&idx, &p); {
		if _, ok := ports[idx]; !ok {
			stale = append(stale, idx)
		}
	}
	for _, idx := range stale {
		if err := m.Delete(idx); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("bridge port %d: %w", idx, err))
		}
	}
	return errors.Join(errs...)
}

// detach takes a's program off its device side: it unpins and closes its
// tcx link, or deletes its cls_bpf filter. A device already gone took the
// program with it.
func (a tcAttached) detach(egress bool) error {
	if a.link != nil {
		_ = a.link.Unpin()
		return a.link.Close()
	}
	l, err := netlink.LinkByIndex(a.ifindex)
	if err != nil {
		return nil
	}
	f := &netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: l.Attrs().Index, Parent: clsParent(egress),
		Handle: clsHandle, Priority: clsPriority, Protocol: unix.ETH_P_ALL}}
	if err := netlink.FilterDel(f); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}

func progName(p *ebpf.Program) string {
	if info, err := p.Info(); err == nil {
		return info.Name
	}
	return p.String()
}

// attachTC puts prog on the ingress (or egress) of device idx: it swaps
// prog into weft's pinned tcx link there, or attaches and pins a new one;
// without tcx (or with Config.TCLegacy) it replaces weft's cls_bpf filter
// on the device's clsact qdisc, adding the qdisc if needed. Either way
// there is no moment without a program, and other programs on the device
// stay.
func (b *Backend) attachTC(idx int, egress bool, prog *ebpf.Program) (tcAttached, error) {
	if !b.cfg.TCLegacy {
		path := filepath.Join(b.cfg.PinPath, tcPinName(idx, egress))
		l, err := link.LoadPinnedLink(path, nil)
		if err == nil {
			if err := l.Update(prog); err != nil {
				_ = l.Close()
				return tcAttached{}, fmt.Errorf("updating the pinned tcx link: %w", err)
			}
			return tcAttached{ifindex: idx, prog: prog, link: l}, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return tcAttached{}, fmt.Errorf("loading the pinned tcx link: %w", err)
		}
		attach := ebpf.AttachTCXIngress
		if egress {
			attach = ebpf.AttachTCXEgress
		}
		l, err = link.AttachTCX(link.TCXOptions{Interface: idx, Program: prog, Attach: attach})
		if err == nil {
			if err := l.Pin(path); err != nil {
				_ = l.Close()
				return tcAttached{}, fmt.Errorf("pinning the tcx link: %w", err)
			}
			return tcAttached{ifindex: idx, prog: prog, link: l}, nil
		}
		if !errors.Is(err, ebpf.ErrNotSupported) {
			return tcAttached{}, err
		}
	}
	if err := netlink.QdiscReplace(clsact(idx)); err != nil {
		return tcAttached{}, fmt.Errorf("adding the clsact qdisc: %w", err)
	}
	f := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: idx, Parent: clsParent(egress), Handle: clsHandle,
			Priority: clsPriority, Protocol: unix.ETH_P_ALL},
		Fd: prog.FD(), Name: progName(prog), DirectAction: true,
	}
	if err := netlink.FilterReplace(f); err != nil {
		return tcAttached{}, fmt.Errorf("replacing the cls_bpf filter: %w", err)
	}
	return tcAttached{ifindex: idx, prog: prog}, nil
}

func clsParent(egress bool) uint32 {
	if egress {
		return netlink.HANDLE_MIN_EGRESS
	}
	return netlink.HANDLE_MIN_INGRESS
}

func clsact(idx int) *netlink.GenericQdisc {
	return &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: idx, Handle: netlink.MakeHandle(0xffff, 0),
		Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}
}

// dropStaleTC removes weft's per-packet programs from the devices and
// sides that should not run one (such as the pod bridge, where an earlier
// version translated replies).
func (b *Backend) dropStaleTC() error {
	type side struct {
		ifindex int
		egress  bool
	}
	keep := map[side]bool{}
	for h, a := range b.tc {
		keep[side{a.ifindex, h.egress}] = true
	}
	return removeTC(b.cfg.PinPath, func(idx int, egress bool) bool { return keep[side{idx, egress}] })
}

// removeTC removes weft's pinned tcx links and cls_bpf filters except on
// the device sides keep names.
func removeTC(pinPath string, keep func(ifindex int, egress bool) bool) error {
	var errs []error
	entries, err := os.ReadDir(pinPath)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("cleanup: %w", err))
	}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), tcxPinPrefix)
		if !ok {
			continue
		}
		num, egress := strings.CutPrefix(rest, "egress_")
		if idx, err := strconv.Atoi(num); err == nil && keep(idx, egress) {
			continue
		}
		path := filepath.Join(pinPath, e.Name())
		l, err := link.LoadPinnedLink(path, nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("cleanup: loading %s: %w", path, err))
			continue
		}
		if err := l.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("cleanup: unpinning %s: %w", path, err))
		}
		_ = l.Close()
	}
	links, err := netlink.LinkList()
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("cleanup: listing links: %w", err))...)
	}
	for _, l := range links {
		for _, egress := range []bool{false, true} {
			if keep(l.Attrs().Index, egress) {
				continue
			}
			filters, err := netlink.FilterList(l, clsParent(egress))
			if err != nil {
				continue // no clsact qdisc
			}
			for _, f := range filters {
				bf, ok := f.(*netlink.BpfFilter)
				if !ok || bf.Priority != clsPriority || bf.Handle != clsHandle || !strings.HasPrefix(bf.Name, "weft_") {
					continue
				}
				if err := netlink.FilterDel(bf); err != nil {
					errs = append(errs, fmt.Errorf("cleanup: deleting the cls_bpf filter on %s: %w", l.Attrs().Name, err))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// uplinksOf returns the names of the links holding one of ips.
func uplinksOf(ips []netip.Addr) ([]string, error) {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("listing addresses: %w", err)
	}
	seen := map[int]bool{}
	var out []string
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || seen[a.LinkIndex] {
			continue
		}
		for _, want := range ips {
			if ip.Unmap() == want.Unmap() {
				l, err := netlink.LinkByIndex(a.LinkIndex)
				if err != nil {
					return nil, fmt.Errorf("link of %s: %w", ip, err)
				}
				seen[a.LinkIndex] = true
				out = append(out, l.Attrs().Name)
				break
			}
		}
	}
	return out, nil
}
