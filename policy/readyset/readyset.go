// Package readyset is the kernel's record of the pod addresses whose
// NetworkPolicy state the node agent has programmed: one hash:ip ipset per
// family (SetName). The policy rules (policy/iptables, PodBridges) drop
// traffic to and from a pod address of the node that is not in it, so a
// new pod is default-deny until the agent has programmed it.
//
// Two writers keep it exact, both under the CNI plugin's IPAM lock: the
// plugin removes the addresses it hands to a new attachment (Revoke; an
// address may have been ready for a previous pod), and the agent adds an
// address once the chains covering its pod are applied (Add) and removes
// addresses no attachment holds any more (Del). The package talks netlink
// only, so that the plugin stays lean.
package readyset

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The ready sets' names. They start with the policy backend's set
// prefixes (WEFT-POL-, WEFT-POL6-), so the backend's cleanup removes them.
const (
	Name4 = "WEFT-POL-READY"
	Name6 = "WEFT-POL6-READY"
)

// SetName is the ready set of a's family.
func SetName(a netip.Addr) string {
	if a.Is4() || a.Is4In6() {
		return Name4
	}
	return Name6
}

// Revoke removes addrs from their ready sets. A set that does not exist
// (NetworkPolicy is not enforced on this node) or an address not in it is
// no error.
func Revoke(addrs []netip.Addr) error {
	for _, a := range addrs {
		if err := netlink.IpsetDel(SetName(a), entry(a)); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("removing %s from ipset %s: %w", a, SetName(a), err)
		}
	}
	return nil
}

// Add puts addrs in their ready sets, which must exist.
func Add(addrs []netip.Addr) error {
	for _, a := range addrs {
		if err := netlink.IpsetAdd(SetName(a), entry(a)); err != nil {
			return fmt.Errorf("adding %s to ipset %s: %w", a, SetName(a), err)
		}
	}
	return nil
}

// Del removes addrs from their ready sets.
func Del(addrs []netip.Addr) error {
	for _, a := range addrs {
		if err := netlink.IpsetDel(SetName(a), entry(a)); err != nil {
			return fmt.Errorf("removing %s from ipset %s: %w", a, SetName(a), err)
		}
	}
	return nil
}

// Members lists the addresses in the ready set named name; a set that does
// not exist is empty.
func Members(name string) (map[netip.Addr]bool, error) {
	res, err := netlink.IpsetList(name)
	if errors.Is(err, unix.ENOENT) {
		return map[netip.Addr]bool{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing ipset %s: %w", name, err)
	}
	out := make(map[netip.Addr]bool, len(res.Entries))
	for _, e := range res.Entries {
		if a, ok := netip.AddrFromSlice(e.IP); ok {
			out[a.Unmap()] = true
		}
	}
	return out, nil
}

// entry is a's set entry; Replace makes adding a present address and
// removing an absent one succeed (ipset's -exist).
func entry(a netip.Addr) *netlink.IPSetEntry {
	ip := net.IP(a.AsSlice())
	if a.Is4() {
		ip = ip.To4()
	}
	return &netlink.IPSetEntry{IP: ip, Replace: true}
}
