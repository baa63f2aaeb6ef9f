package routing

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/nlutil"
)

// ensureDevice makes weft's VXLAN device match want and returns its index,
// also when some in-place fix failed (0 when there is no usable device).
// What the kernel can change on a live device (MTU, MAC, learning, alias,
// addresses, up) is fixed in place; a device with another VNI, port or
// local address is deleted and created again; a link of that name that is
// not a VXLAN device is not weft's and is left alone.
func (s *session) ensureDevice(want VXLANDevice) (int, error) {
	fail := func(err error) (int, error) { return 0, fmt.Errorf("vxlan device %s: %w", want.Name, err) }
	mtu, err := s.deviceMTU(want.MTU, want.Local, overhead(want.Local))
	if err != nil {
		return fail(err)
	}
	l, err := s.h.LinkByName(want.Name)
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		if l, err = s.createDevice(want, mtu); err != nil {
			return fail(err)
		}
	case err != nil:
		return fail(err)
	}
	v, ok := l.(*netlink.Vxlan)
	if !ok {
		return fail(fmt.Errorf("a %s link of that name exists and is not weft's", l.Type()))
	}
	if v.VxlanId != int(want.VNI) || v.Port != int(want.Port) || !v.SrcAddr.Equal(net.IP(want.Local.AsSlice())) {
		if err := s.h.LinkDel(v); err != nil {
			return fail(fmt.Errorf("deleting it to change vni/port/local: %w", err))
		}
		if l, err = s.createDevice(want, mtu); err != nil {
			return fail(err)
		}
		v = l.(*netlink.Vxlan)
	}
	var errs []error
	if v.Learning {
		errs = append(errs, wrap("turning learning off", setLearning(v.Index, false)))
	}
	if !bytes.Equal(v.HardwareAddr, want.MAC) {
		errs = append(errs, wrap("setting mac "+want.MAC.String(), s.h.LinkSetHardwareAddr(v, want.MAC)))
	}
	errs = append(errs, s.settle(v, mtu, want.Addrs)...)
	if err := errors.Join(errs...); err != nil {
		return v.Index, fmt.Errorf("vxlan device %s: %w", want.Name, err)
	}
	return v.Index, nil
}

// createDevice creates the device. Other weft VXLAN devices go first: a
// renamed device would clash with its predecessor's VNI, port and local
// address. An IPIP device of an earlier mode goes only once the routes
// have moved off it (Apply).
func (s *session) createDevice(want VXLANDevice, mtu int) (netlink.Link, error) {
	if err := errors.Join(s.deleteDevices(want.Name, true)...); err != nil {
		return nil, err
	}
	attrs := netlink.NewLinkAttrs()
	attrs.Name, attrs.MTU, attrs.HardwareAddr, attrs.Alias = want.Name, mtu, want.MAC, DeviceAlias
	v := &netlink.Vxlan{
		LinkAttrs: attrs,
		VxlanId:   int(want.VNI),
		SrcAddr:   want.Local.AsSlice(),
		Port:      int(want.Port),
		Learning:  false,
	}
	if err := s.h.LinkAdd(v); err != nil {
		return nil, fmt.Errorf("creating it: %w", err)
	}
	return s.h.LinkByName(want.Name)
}

// deviceMTU is fixed if set, else the MTU of the underlay link holding
// local minus the encapsulation's overhead.
func (s *session) deviceMTU(fixed int, local netip.Addr, overhead int) (int, error) {
	if fixed != 0 {
		return fixed, nil
	}
	under, err := s.underlayMTU(local)
	if err != nil {
		return 0, err
	}
	return under - overhead, nil
}

// settle fixes in place what every weft device must be: marked with
// DeviceAlias, at mtu, holding exactly addrs, and up.
func (s *session) settle(l netlink.Link, mtu int, addrs []netip.Prefix) []error {
	var errs []error
	a := l.Attrs()
	if a.Alias != DeviceAlias {
		errs = append(errs, wrap("setting alias", s.h.LinkSetAlias(l, DeviceAlias)))
	}
	if a.MTU != mtu {
		errs = append(errs, wrap(fmt.Sprintf("setting mtu %d", mtu), s.h.LinkSetMTU(l, mtu)))
	}
	errs = append(errs, nlutil.SyncAddrs(s.h, l, addrs)...)
	if a.Flags&net.FlagUp == 0 {
		errs = append(errs, wrap("setting it up", s.h.LinkSetUp(l)))
	}
	return errs
}

// underlayMTU is the MTU of the link that holds the local address.
func (s *session) underlayMTU(local netip.Addr) (int, error) {
	fam := unix.AF_INET
	if local.Is6() {
		fam = unix.AF_INET6
	}
	addrs, err := nlutil.Dump("addresses", func() ([]netlink.Addr, error) { return s.h.AddrList(nil, fam) })
	if err != nil {
		return 0, err
	}
	for _, a := range addrs {
		if a.IP.Equal(local.AsSlice()) {
			l, err := s.h.LinkByIndex(a.LinkIndex)
			if err != nil {
				return 0, fmt.Errorf("underlay link of %s: %w", local, err)
			}
			return l.Attrs().MTU, nil
		}
	}
	return 0, fmt.Errorf("no link holds the local address %s: %w", local, ErrMissing)
}

// ensureIPIP makes weft's IPIP device match want and returns its index
// (0 when there is no usable device). A kernel without IPIP tunnels is
// named in the error.
func (s *session) ensureIPIP(want IPIPDevice) (int, error) {
	fail := func(err error) (int, error) { return 0, fmt.Errorf("ipip device %s: %w", want.Name, err) }
	mtu, err := s.deviceMTU(want.MTU, want.Local, OverheadIPIP)
	if err != nil {
		return fail(err)
	}
	l, err := s.h.LinkByName(want.Name)
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		l = nil
	case err != nil:
		return fail(err)
	}
	t, ok := l.(*netlink.Iptun)
	if l != nil && !ok {
		return fail(fmt.Errorf("a %s link of that name exists and is not weft's", l.Type()))
	}
	if t == nil || !t.Local.Equal(want.Local.AsSlice()) || t.Remote != nil && !t.Remote.IsUnspecified() {
		if t != nil {
			if err := s.h.LinkDel(t); err != nil {
				return fail(fmt.Errorf("deleting it to change its local address: %w", err))
			}
		}
		attrs := netlink.NewLinkAttrs()
		attrs.Name, attrs.MTU, attrs.Alias = want.Name, mtu, DeviceAlias
		if err := s.h.LinkAdd(&netlink.Iptun{LinkAttrs: attrs, Local: want.Local.AsSlice(), PMtuDisc: 1}); err != nil {
			if errors.Is(err, unix.EOPNOTSUPP) {
				err = errNoIPIP
			}
			return fail(fmt.Errorf("creating it: %w", err))
		}
		if l, err = s.h.LinkByName(want.Name); err != nil {
			return fail(err)
		}
		t = l.(*netlink.Iptun)
	}
	if err := errors.Join(s.settle(t, mtu, want.Addrs)...); err != nil {
		return t.Index, fmt.Errorf("ipip device %s: %w", want.Name, err)
	}
	return t.Index, nil
}

// deleteDevices deletes weft's VXLAN and IPIP devices (with vxlanOnly, its
// VXLAN devices) except the one named keep.
func (s *session) deleteDevices(keep string, vxlanOnly bool) []error {
	links, err := nlutil.Dump("links", s.h.LinkList)
	if err != nil {
		return []error{err}
	}
	var errs []error
	for _, l := range links {
		switch l.(type) {
		case *netlink.Vxlan:
		case *netlink.Iptun:
			if vxlanOnly {
				continue
			}
		default:
			continue
		}
		if l.Attrs().Alias == DeviceAlias && l.Attrs().Name != keep {
			if err := s.h.LinkDel(l); err != nil {
				errs = append(errs, fmt.Errorf("deleting %s device %s: %w", l.Type(), l.Attrs().Name, err))
			}
		}
	}
	return errs
}

// setLearning changes the learning flag of a live VXLAN device. The
// netlink library's LinkModify would resend every VXLAN attribute, and the
// kernel refuses to change most of them on a live device, so the request
// carries this one attribute only.
func setLearning(index int, on bool) error {
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(index)
	req.AddData(msg)
	info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
	info.AddRtAttr(nl.IFLA_INFO_KIND, nl.NonZeroTerminated("vxlan"))
	data := info.AddRtAttr(nl.IFLA_INFO_DATA, nil)
	flag := []byte{0}
	if on {
		flag[0] = 1
	}
	data.AddRtAttr(nl.IFLA_VXLAN_LEARNING, flag)
	req.AddData(info)
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}

// wrap adds context to a non-nil error.
func wrap(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}

var errNoIPIP = errors.New("this kernel has no IPIP tunnels (the ipip module): use --routing vxlan, or hostgw between nodes on one segment")

// CheckIPIP reports whether the calling thread's namespace can make IPIP
// tunnels: it creates a probe device and deletes it again. weft-agent
// refuses to start in ipip mode without them.
func CheckIPIP() error {
	attrs := netlink.NewLinkAttrs()
	attrs.Name = "weft.ipipchk"
	// A local address of its own: one with none would clash with the
	// module's fallback device (tunl0), which takes any.
	t := &netlink.Iptun{LinkAttrs: attrs, Local: net.IPv4(127, 0, 0, 87)}
	if err := netlink.LinkAdd(t); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			return errNoIPIP
		}
		return fmt.Errorf("creating an IPIP probe device: %w", err)
	}
	return netlink.LinkDel(t)
}
