// Package nlutil holds netlink helpers shared by the CNI plugin, routing
// and the agent.
package nlutil

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Dump runs a netlink dump, retrying one the kernel interrupted (the table
// changed while it was read, e.g. links vanishing with a deleted
// namespace), so that decisions are never taken on a partial listing.
func Dump[T any](what string, list func() ([]T, error)) ([]T, error) {
	for attempt := 1; ; attempt++ {
		out, err := list()
		switch {
		case err == nil:
			return out, nil
		case !errors.Is(err, netlink.ErrDumpInterrupted) || attempt == 5:
			return nil, fmt.Errorf("listing %s: %w", what, err)
		}
	}
}

// RouteDst is a kernel route's destination; a default route has none.
func RouteDst(r netlink.Route) netip.Prefix {
	if r.Dst == nil {
		if r.Family == unix.AF_INET6 {
			return netip.PrefixFrom(netip.IPv6Unspecified(), 0)
		}
		return netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	}
	a, _ := netip.AddrFromSlice(r.Dst.IP)
	ones, _ := r.Dst.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones)
}

// IPNet is p in the netlink library's terms.
func IPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// SyncAddrs gives link exactly the addresses want, through h (a zero
// Handle: the calling thread's namespace), leaving the kernel's link-local
// ones alone. IPv6 addresses are added without DAD: their owner is single
// by construction. Each failure names the address.
func SyncAddrs(h *netlink.Handle, link netlink.Link, want []netip.Prefix) []error {
	have, err := Dump("addresses of "+link.Attrs().Name, func() ([]netlink.Addr, error) {
		return h.AddrList(link, netlink.FAMILY_ALL)
	})
	if err != nil {
		return []error{err}
	}
	wanted := map[netip.Prefix]bool{}
	for _, p := range want {
		wanted[p] = true
	}
	var errs []error
	for _, a := range have {
		ip, _ := netip.AddrFromSlice(a.IP)
		ones, _ := a.Mask.Size()
		p := netip.PrefixFrom(ip.Unmap(), ones)
		switch {
		case wanted[p]:
			delete(wanted, p)
		case ip.IsLinkLocalUnicast():
		default:
			if err := h.AddrDel(link, &a); err != nil {
				errs = append(errs, fmt.Errorf("deleting address %s from %s: %w", p, link.Attrs().Name, err))
			}
		}
	}
	for _, p := range want {
		if !wanted[p] {
			continue
		}
		a := &netlink.Addr{IPNet: IPNet(p)}
		if p.Addr().Is6() {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := h.AddrAdd(link, a); err != nil {
			errs = append(errs, fmt.Errorf("adding address %s to %s: %w", p, link.Attrs().Name, err))
		}
	}
	return errs
}
