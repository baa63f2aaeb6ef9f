package proxy

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// StaleUDP names the UDP conntrack entries that would keep a client on a
// path the proxy no longer programs. Without their removal, a UDP client
// that keeps sending (within the entry's timeout) keeps hitting the old
// entry: a removed endpoint, an endpoint's old target port, or the drop
// recorded while a Service had no endpoints.
type StaleUDP struct {
	// Endpoint: the entries whose replies come from this address and port
	// (an endpoint no longer used, or no longer at that port).
	Endpoint netip.AddrPort
	// Dest: the entries whose original destination is this address and
	// port (a Service address that had no endpoints); with an invalid
	// address, every entry to the port (a node port, on any address).
	Dest netip.AddrPort
}

func (s StaleUDP) String() string {
	switch {
	case s.Endpoint.IsValid():
		return "replies from " + s.Endpoint.String()
	case s.Dest.Addr().IsValid():
		return "to " + s.Dest.String()
	}
	return fmt.Sprintf("to port %d", s.Dest.Port())
}

// MatchConntrackFlow implements netlink.CustomConntrackFilter.
func (s StaleUDP) MatchConntrackFlow(f *netlink.ConntrackFlow) bool {
	if f.Forward.Protocol != unix.IPPROTO_UDP {
		return false
	}
	if s.Endpoint.IsValid() {
		return f.Reverse.SrcPort == s.Endpoint.Port() && sameAddr(f.Reverse.SrcIP, s.Endpoint.Addr())
	}
	return f.Forward.DstPort == s.Dest.Port() && (!s.Dest.Addr().IsValid() || sameAddr(f.Forward.DstIP, s.Dest.Addr()))
}

func sameAddr(ip net.IP, a netip.Addr) bool {
	b, ok := netip.AddrFromSlice(ip)
	return ok && b.Unmap() == a.Unmap()
}

// flushUDP deletes the kernel's conntrack entries s names.
func flushUDP(s StaleUDP) error {
	families := []netlink.InetFamily{unix.AF_INET, unix.AF_INET6}
	switch a := s.Endpoint.Addr(); {
	case s.Endpoint.IsValid() && a.Is4():
		families = families[:1]
	case s.Endpoint.IsValid():
		families = families[1:]
	case s.Dest.Addr().Is4():
		families = families[:1]
	case s.Dest.Addr().IsValid():
		families = families[1:]
	}
	for _, fam := range families {
		if _, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, fam, s); err != nil {
			return fmt.Errorf("deleting UDP conntrack entries %s: %w", s, err)
		}
	}
	return nil
}
