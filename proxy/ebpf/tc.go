package ebpf

import (
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
)

// tcxPinPrefix starts the pin name of a tcx link, followed by the ifindex
// of its device.
const tcxPinPrefix = "tcx_"

// clsPriority and clsHandle identify weft's cls_bpf filters on a clsact
// ingress (kernels without tcx); the filter's name is its program's.
const (
	clsPriority = 0x7765
	clsHandle   = 0x7765
)

// tcAttached is a per-packet program on one device's ingress.
type tcAttached struct {
	ifindex int
	prog    *ebpf.Program
	link    link.Link // nil for a cls_bpf filter
}

// devicePrograms returns the program each device's ingress should run:
// weft_nodeport on the uplinks, weft_reply on the pod devices.
func (b *Backend) devicePrograms() map[string]*ebpf.Program {
	want := map[string]*ebpf.Program{}
	for _, d := range b.cfg.PodDevices {
		want[d] = b.np.WeftReply
	}
	for _, d := range b.uplinks {
		want[d] = b.np.WeftNodeport
	}
	return want
}

// attachDevices puts the per-packet programs on every device that should
// run one and does not yet (a device created, or created again, since the
// last sync). An uplink that does not exist is an error; a pod device
// that does not exist yet (the CNI bridge before the first pod) is tried
// again at the next sync.
func (b *Backend) attachDevices() error {
	var errs []error
	for name, prog := range b.devicePrograms() {
		l, err := netlink.LinkByName(name)
		if err != nil {
			var nf netlink.LinkNotFoundError
			if errors.As(err, &nf) && !slices.Contains(b.uplinks, name) {
				continue
			}
			errs = append(errs, fmt.Errorf("device %s: %w", name, err))
			continue
		}
		idx := l.Attrs().Index
		if cur, ok := b.tc[name]; ok && cur.ifindex == idx && cur.prog == prog {
			continue
		}
		a, err := b.attachTC(idx, prog)
		if err != nil {
			errs = append(errs, fmt.Errorf("attaching %s to %s: %w", progName(prog), name, err))
			continue
		}
		if cur, ok := b.tc[name]; ok && cur.link != nil && cur.ifindex != idx {
			_ = cur.link.Close()
		}
		b.tc[name] = a
	}
	return errors.Join(errs...)
}

func progName(p *ebpf.Program) string {
	if info, err := p.Info(); err == nil {
		return info.Name
	}
	return p.String()
}

// attachTC puts prog on the ingress of device idx: it swaps prog into
// weft's pinned tcx link of the device, or attaches and pins a new one;
// without tcx (or with Config.TCLegacy) it replaces weft's cls_bpf filter
// on the device's clsact qdisc, adding the qdisc if needed. Either way
// there is no moment without a program, and other programs on the device
// stay.
func (b *Backend) attachTC(idx int, prog *ebpf.Program) (tcAttached, error) {
	if !b.cfg.TCLegacy {
		path := filepath.Join(b.cfg.PinPath, tcxPinPrefix+strconv.Itoa(idx))
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
		l, err = link.AttachTCX(link.TCXOptions{Interface: idx, Program: prog, Attach: ebpf.AttachTCXIngress})
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
		FilterAttrs: netlink.FilterAttrs{LinkIndex: idx, Parent: netlink.HANDLE_MIN_INGRESS, Handle: clsHandle,
			Priority: clsPriority, Protocol: unix.ETH_P_ALL},
		Fd: prog.FD(), Name: progName(prog), DirectAction: true,
	}
	if err := netlink.FilterReplace(f); err != nil {
		return tcAttached{}, fmt.Errorf("replacing the cls_bpf filter: %w", err)
	}
	return tcAttached{ifindex: idx, prog: prog}, nil
}

func clsact(idx int) *netlink.GenericQdisc {
	return &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: idx, Handle: netlink.MakeHandle(0xffff, 0),
		Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}
}

// cleanupTC removes weft's per-packet programs from every device: its
// pinned tcx links and its cls_bpf filters (by priority, handle and
// name); other programs and filters stay, and so does a clsact qdisc
// (weft cannot tell whether it added it).
func (b *Backend) cleanupTC() error {
	var errs []error
	for _, a := range b.tc {
		if a.link != nil {
			_ = a.link.Close()
		}
	}
	b.tc = map[string]tcAttached{}
	entries, err := os.ReadDir(b.cfg.PinPath)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("cleanup: %w", err))
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), tcxPinPrefix) {
			continue
		}
		path := filepath.Join(b.cfg.PinPath, e.Name())
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
		filters, err := netlink.FilterList(l, netlink.HANDLE_MIN_INGRESS)
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
	return errors.Join(errs...)
}

// loadNodeportWith loads the per-packet programs; fibSrc tells them that
// the route lookup gives the SNAT source.
func loadNodeportWith(np *nodeportObjects, opts *ebpf.CollectionOptions, fibSrc bool) error {
	spec, err := loadNodeport()
	if err != nil {
		return err
	}
	v := uint8(0)
	if fibSrc {
		v = 1
	}
	if err := spec.Variables["fib_src"].Set(v); err != nil {
		return fmt.Errorf("setting fib_src: %w", err)
	}
	return spec.LoadAndAssign(np, opts)
}

// writeDevAddrs writes the node's first global IPv4 and IPv6 address of
// every link to m (the SNAT source toward a backend routed through that
// link) and deletes the links of written that are gone.
func writeDevAddrs(m *ebpf.Map, written map[uint32]bool) error {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("listing addresses: %w", err)
	}
	want := map[uint32]*nodeportDevAddrs{}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || a.Scope != unix.RT_SCOPE_UNIVERSE {
			continue
		}
		ip = ip.Unmap()
		idx := uint32(a.LinkIndex)
		d := want[idx]
		if d == nil {
			d = &nodeportDevAddrs{}
			want[idx] = d
		}
		if ip.Is4() && d.V4 == 0 {
			d.V4 = toWords(ip)[3]
		} else if ip.Is6() && d.V6 == ([4]uint32{}) {
			d.V6 = toWords(ip)
		}
	}
	for idx, d := range want {
		if err := m.Update(idx, d, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("writing the addresses of link %d: %w", idx, err)
		}
		written[idx] = true
	}
	for idx := range written {
		if want[idx] != nil {
			continue
		}
		if err := m.Delete(idx); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("deleting the addresses of link %d: %w", idx, err)
		}
		delete(written, idx)
	}
	return nil
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
