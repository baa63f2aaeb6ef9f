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
// addresses no attachment holds any more (Del). What the plugin calls
// talks netlink only: no process is started on its path.
package readyset

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"

	"github.com/vishvananda/netlink"
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

// Revoke removes addrs from their ready sets, the ipsets of the iptables
// backend and the nftables sets of the nftables one (see nft.go). A set
// that does not exist, or a kernel without ipset or nftables
// (NetworkPolicy is not enforced that way on this node), or an address
// not in the set is no error. It is OpenRevoker, Revoke and Close.
func Revoke(addrs []netip.Addr) error {
	r, err := OpenRevoker()
	if err != nil {
		return err
	}
	defer r.Close()
	return r.Revoke(addrs)
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

// Members lists the addresses in the ready set named name (with `ipset
// list`: the netlink library logs every attribute it does not know, and
// listing is the agent's, not the plugin's); a set that does not exist is
// empty.
func Members(name string) (map[netip.Addr]bool, error) {
	out, err := exec.Command("ipset", "list", name, "-o", "save").CombinedOutput()
	if err != nil {
		if bytes.Contains(out, []byte("does not exist")) {
			return map[netip.Addr]bool{}, nil
		}
		return nil, fmt.Errorf("ipset list %s: %w: %s", name, err, bytes.TrimSpace(out))
	}
	return parseSave(out, name)
}

// parseSave reads the members of set name from `ipset save` output.
func parseSave(b []byte, name string) (map[netip.Addr]bool, error) {
	m := map[netip.Addr]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "add" || f[1] != name {
			continue
		}
		a, err := netip.ParseAddr(f[2])
		if err != nil {
			return nil, fmt.Errorf("ipset %s member %q: %w", name, f[2], err)
		}
		m[a] = true
	}
	return m, nil
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
