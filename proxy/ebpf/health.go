package ebpf

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
)

// Programs can leave their hooks behind weft's back: a cgroup link is
// detached when its cgroup is removed or someone detaches the link
// (BPF_LINK_DETACH), a tcx or XDP link when its device goes, a cls_bpf
// filter when someone deletes it. Each sync checks every program weft attached
// and attaches the missing ones again, counting them
// (weft_ebpf_program_reattached_total).

// cgroupAttached reports whether the cgroup link l still holds its
// program on a cgroup.
func cgroupAttached(l link.Link) bool {
	info, err := l.Info()
	if err != nil {
		return false
	}
	cg := info.Cgroup()
	return cg != nil && cg.CgroupId != 0
}

// attached reports whether a still runs on its side of its device.
func (a tcAttached) attached(egress bool) bool {
	if a.link != nil {
		info, err := a.link.Info()
		if err != nil {
			return false
		}
		tcx := info.TCX()
		return tcx != nil && int(tcx.Ifindex) == a.ifindex
	}
	l, err := netlink.LinkByIndex(a.ifindex)
	if err != nil {
		return false
	}
	filters, err := netlink.FilterList(l, clsParent(egress))
	if err != nil {
		return false
	}
	name := progName(a.prog)
	for _, f := range filters {
		if bf, ok := f.(*netlink.BpfFilter); ok && bf.Priority == clsPriority && bf.Handle == clsHandle && bf.Name == name {
			return true
		}
	}
	return false
}

// attached reports whether a's XDP link still holds its program on its
// device (a device without XDP, mode tc, has nothing to lose).
func (a xdpAttached) attached() bool {
	if a.link == nil {
		return true
	}
	info, err := a.link.Info()
	if err != nil {
		return false
	}
	x := info.XDP()
	return x != nil && int(x.Ifindex) == a.ifindex
}

// xdpHookName names a device's XDP hook in metrics: "xdp:<device>".
func xdpHookName(device string) string { return "xdp:" + device }

// String names a device side in metrics: "tc:<device>:ingress".
func (h tcHook) String() string {
	side := "ingress"
	if h.egress {
		side = "egress"
	}
	return "tc:" + h.device + ":" + side
}

// reattach attaches again the cgroup programs found detached, and forgets
// the device programs found detached so that attachDevices attaches them
// again; it counts each.
func (b *Backend) reattach() error {
	var errs []error
	for i, h := range hooks {
		if cgroupAttached(b.links[i]) {
			continue
		}
		// The dead link's pin would be updated in place: drop it first.
		if err := b.links[i].Unpin(); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("unpinning the detached %s link: %w", h.name, err))
			continue
		}
		_ = b.links[i].Close()
		l, err := b.attach(h, h.prog(&b.objs.sockPrograms))
		if err != nil {
			errs = append(errs, fmt.Errorf("attaching %s to %s again: %w", h.name, b.cfg.CgroupRoot, err))
			continue
		}
		b.links[i] = l
		b.reattached[h.name]++
	}
	for h, a := range b.tc {
		if a.attached(h.egress) {
			continue
		}
		if a.link != nil {
			_ = a.link.Unpin()
			_ = a.link.Close()
		}
		delete(b.tc, h)
		b.reattached[h.String()]++
	}
	for d, a := range b.xdp {
		if a.attached() {
			continue
		}
		_ = a.link.Unpin()
		_ = a.link.Close()
		delete(b.xdp, d)
		b.reattached[xdpHookName(d)]++
	}
	return errors.Join(errs...)
}

// attachments reports, for every hook weft attached a program to, whether
// it is still there.
func (b *Backend) attachments() map[string]bool {
	out := map[string]bool{}
	for i, h := range hooks {
		if i < len(b.links) {
			out[h.name] = cgroupAttached(b.links[i])
		}
	}
	for h, a := range b.tc {
		out[h.String()] = a.attached(h.egress)
	}
	for d, a := range b.xdp {
		if a.link != nil {
			out[xdpHookName(d)] = a.attached()
		}
	}
	return out
}
