// Package nlutil holds netlink helpers shared by the CNI plugin, routing
// and the agent.
package nlutil

import (
	"errors"
	"fmt"
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
