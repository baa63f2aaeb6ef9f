package ebpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
)

// XDP modes of the external frontends' translation (--bpf-xdp; see
// bpf/xdp.h). off: tc only. native: weft_nodeport_xdp in the driver of
// every uplink, a device whose driver cannot is an error. generic: in the
// kernel's generic XDP hook (any device; after the skb is built, so it
// saves little over tc: for tests and drivers with broken native XDP).
// auto: native where the driver can, tc elsewhere (reported).
const (
	XDPOff     = "off"
	XDPAuto    = "auto"
	XDPNative  = "native"
	XDPGeneric = "generic"
	// xdpTC is a device's mode in the log and weft_ebpf_xdp_mode where
	// XDP is not attached (auto fell back, or off).
	xdpTC = "tc"
)

// CheckXDPMode returns an error naming the flag for a mode that is not one
// of the above ("" is off).
func CheckXDPMode(mode string) error {
	switch mode {
	case "", XDPOff, XDPAuto, XDPNative, XDPGeneric:
		return nil
	}
	return fmt.Errorf("--bpf-xdp: %q is not one of auto, native, generic, off", mode)
}

// xdpMode is the mode's name ("" is off).
func (c Config) xdpMode() string {
	if c.XDP == "" {
		return XDPOff
	}
	return c.XDP
}

// xdpPinPrefix starts the pin name of an XDP link: "xdp_<mode>_<ifindex>".
const xdpPinPrefix = "xdp_"

func xdpPinName(idx int, mode string) string {
	return xdpPinPrefix + mode + "_" + strconv.Itoa(idx)
}

// xdpAttached is weft_nodeport_xdp on one uplink (link nil: the device
// runs the tc path only, mode xdpTC).
type xdpAttached struct {
	ifindex int
	mode    string
	link    link.Link
}

// attachXDP puts weft_nodeport_xdp on the uplinks that are not bridges
// (a bridge's ports run weft_nodeport_port on tc, which XDP does not
// replace) as --bpf-xdp says, and records each device's mode. The tc
// programs stay attached under it: they do what XDP leaves to them
// (bpf/xdp.h), so a device without XDP loses nothing but speed.
func (b *Backend) attachXDP() error {
	mode := b.cfg.xdpMode()
	var errs []error
	want := map[string]bool{}
	for _, d := range b.uplinks {
		l, err := netlink.LinkByName(d)
		if err != nil {
			errs = append(errs, fmt.Errorf("device %s: %w", d, err))
			continue
		}
		if _, ok := l.(*netlink.Bridge); ok {
			continue
		}
		want[d] = true
		idx := l.Attrs().Index
		cur, ok := b.xdp[d]
		if ok && cur.ifindex == idx {
			continue
		}
		if ok && cur.link != nil {
			// The device was created again: its program went with it.
			_ = cur.link.Unpin()
			_ = cur.link.Close()
		}
		if mode == XDPOff {
			b.xdp[d] = xdpAttached{ifindex: idx, mode: xdpTC}
			continue
		}
		a, err := b.attachXDPDevice(idx, mode == XDPGeneric)
		if err != nil && mode == XDPAuto {
			b.cfg.Log.Warn("XDP: the device's driver has no native XDP, its external traffic takes the tc path", "device", d, "err", err)
			a, err = xdpAttached{ifindex: idx, mode: xdpTC}, nil
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("--bpf-xdp %s on device %s: %w", mode, d, err))
			continue
		}
		b.cfg.Log.Info("XDP", "device", d, "mode", a.mode)
		b.xdp[d] = a
	}
	for d, a := range b.xdp {
		if !want[d] {
			if a.link != nil {
				_ = a.link.Unpin()
				_ = a.link.Close()
			}
			delete(b.xdp, d)
		}
	}
	return errors.Join(errs...)
}

// attachXDPDevice attaches weft_nodeport_xdp to device idx in the
// driver, or in the generic hook: it swaps the program into weft's
// pinned link of that mode there, or attaches and pins a new link after
// removing a pinned link of the other mode.
func (b *Backend) attachXDPDevice(idx int, generic bool) (xdpAttached, error) {
	mode, other, flags := XDPNative, XDPGeneric, link.XDPDriverMode
	if generic {
		mode, other, flags = XDPGeneric, XDPNative, link.XDPGenericMode
	}
	prog := b.np.WeftNodeportXdp
	path := filepath.Join(b.cfg.PinPath, xdpPinName(idx, mode))
	if l, err := link.LoadPinnedLink(path, nil); err == nil {
		if err := l.Update(prog); err != nil {
			_ = l.Close()
			return xdpAttached{}, fmt.Errorf("updating the pinned XDP link: %w", err)
		}
		return xdpAttached{ifindex: idx, mode: mode, link: l}, nil
	}
	if err := unpinLink(filepath.Join(b.cfg.PinPath, xdpPinName(idx, other))); err != nil {
		return xdpAttached{}, err
	}
	l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: idx, Flags: flags})
	if err != nil {
		return xdpAttached{}, err
	}
	if err := l.Pin(path); err != nil {
		_ = l.Close()
		return xdpAttached{}, fmt.Errorf("pinning the XDP link: %w", err)
	}
	return xdpAttached{ifindex: idx, mode: mode, link: l}, nil
}

// unpinLink detaches the link pinned at path, if any.
func unpinLink(path string) error {
	l, err := link.LoadPinnedLink(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("loading %s: %w", path, err)
	}
	defer l.Close()
	if err := l.Unpin(); err != nil {
		return fmt.Errorf("unpinning %s: %w", path, err)
	}
	return nil
}

// removeXDP detaches weft's pinned XDP links except those keep names (by
// pin name).
func removeXDP(pinPath string, keep func(name string) bool) error {
	entries, err := os.ReadDir(pinPath)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("cleanup: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), xdpPinPrefix) || keep(e.Name()) {
			continue
		}
		if err := unpinLink(filepath.Join(pinPath, e.Name())); err != nil {
			errs = append(errs, fmt.Errorf("cleanup: %w", err))
		}
	}
	return errors.Join(errs...)
}

// dropStaleXDP detaches the pinned XDP links of devices and modes this
// backend does not run (another --bpf-xdp before, a device gone).
func (b *Backend) dropStaleXDP() error {
	keep := map[string]bool{}
	for _, a := range b.xdp {
		if a.link != nil {
			keep[xdpPinName(a.ifindex, a.mode)] = true
		}
	}
	return removeXDP(b.cfg.PinPath, func(name string) bool { return keep[name] })
}

// xdpStats sums weft_xdp_stats per action (bpf/xdp.h's XDP_STAT_*).
func xdpStats(m *ebpf.Map) (map[string]uint64, error) {
	out := map[string]uint64{}
	for i, name := range []string{"translated", "dropped", "handoff"} {
		n, err := counterSum(m, uint32(i))
		if err != nil {
			return nil, err
		}
		out[name] = n
	}
	return out, nil
}

// XDPModes returns the hook each uplink's external traffic is translated
// at: native, generic, or tc (weft_ebpf_xdp_mode).
func (b *Backend) XDPModes() map[string]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[string]string{}
	for d, a := range b.xdp {
		out[d] = a.mode
	}
	return out
}

// XDPStats returns weft_nodeport_xdp's packets per action: translated,
// dropped, handoff (weft_ebpf_xdp_packets_total).
func (b *Backend) XDPStats() (map[string]uint64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.np == nil {
		return nil, errors.New("not started")
	}
	return xdpStats(b.np.WeftXdpStats)
}
