package proxy

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// flushUDP deletes the UDP conntrack entries whose replies come from ip
// (a removed endpoint), or, with orig set, whose original destination is
// ip:port (a service VIP that had no endpoints). Without it, a UDP client
// that keeps sending keeps hitting the old entry (and the dead backend).
func flushUDP(ip netip.Addr, port uint16, orig bool) error {
	family := netlink.InetFamily(unix.AF_INET)
	if ip.Is6() {
		family = unix.AF_INET6
	}
	f := &netlink.ConntrackFilter{}
	if err := f.AddProtocol(unix.IPPROTO_UDP); err != nil {
		return err
	}
	if orig {
		if err := f.AddIP(netlink.ConntrackOrigDstIP, net.IP(ip.AsSlice())); err != nil {
			return err
		}
		if err := f.AddPort(netlink.ConntrackOrigDstPort, port); err != nil {
			return err
		}
	} else if err := f.AddIP(netlink.ConntrackReplySrcIP, net.IP(ip.AsSlice())); err != nil {
		return err
	}
	if _, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, family, f); err != nil {
		return fmt.Errorf("deleting UDP conntrack entries for %s: %w", ip, err)
	}
	return nil
}
