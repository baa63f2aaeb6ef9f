package routing

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// VTEPMAC is the MAC weft gives the VXLAN device of node nodeName: the first
// six bytes of SHA-256(nodeName) with the locally administered bit set and
// the multicast bit cleared. It depends on the name only, so an agent
// restart, or a node rebuilt under the same name, keeps its MAC and the other
// nodes' FDB and neighbour entries stay valid.
func VTEPMAC(nodeName string) net.HardwareAddr {
	sum := sha256.Sum256([]byte(nodeName))
	mac := net.HardwareAddr(sum[:6:6])
	mac[0] = mac[0]&^0x01 | 0x02
	return mac
}

// family is 4 or 6.
func family(a netip.Addr) int {
	if a.Is4() {
		return 4
	}
	return 6
}

func familyName(f int) string { return fmt.Sprintf("IPv%d", f) }

// addrsByFamily keeps each family's one usable address; a family with a bad
// or a second address is left out and reported.
func addrsByFamily(ips []netip.Addr) (map[int]netip.Addr, []error) {
	return byFamily(ips, "addresses", checkAddr, func(a netip.Addr) (netip.Addr, bool) { return a, a.IsValid() })
}

// byFamily keeps, per IP family, the one item that passes check; a family
// with a bad item or with two of them is left out, and each problem reported.
func byFamily[T fmt.Stringer](items []T, what string, check func(T) error, addr func(T) (netip.Addr, bool)) (map[int]T, []error) {
	out, bad := map[int]T{}, map[int]bool{}
	var errs []error
	for _, it := range items {
		a, valid := addr(it)
		if err := check(it); err != nil {
			errs = append(errs, err)
			if valid {
				bad[family(a)] = true
			}
			continue
		}
		f := family(a)
		if prev, ok := out[f]; ok {
			errs = append(errs, fmt.Errorf("two %s %s %s and %s: %w", familyName(f), what, prev, it, ErrDuplicate))
			bad[f] = true
		}
		out[f] = it
	}
	for f := range bad {
		delete(out, f)
	}
	return out, errs
}

func checkAddr(a netip.Addr) error {
	switch {
	case !a.IsValid():
		return fmt.Errorf("unparseable (empty) address: %w", ErrInvalid)
	case a.Is4In6():
		return fmt.Errorf("%s is IPv4-mapped, give the IPv4 address: %w", a, ErrInvalid)
	case a.Zone() != "":
		return fmt.Errorf("%s has a zone: %w", a, ErrInvalid)
	case a.IsUnspecified(), a.IsLoopback(), a.IsMulticast(), a.IsLinkLocalUnicast(),
		a.Is4() && a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return fmt.Errorf("%s is not a unicast node address: %w", a, ErrInvalid)
	}
	return nil
}

// prefixesByFamily is addrsByFamily for podCIDRs.
func prefixesByFamily(ps []netip.Prefix) (map[int]netip.Prefix, []error) {
	return byFamily(ps, "podCIDRs", checkPrefix, func(p netip.Prefix) (netip.Addr, bool) { return p.Addr(), p.IsValid() })
}

func checkPrefix(p netip.Prefix) error {
	switch {
	case !p.IsValid():
		return fmt.Errorf("unparseable (empty) podCIDR: %w", ErrInvalid)
	case p.Addr().Is4In6() || p.Addr().Zone() != "":
		return fmt.Errorf("%s is not a plain IPv4 or IPv6 prefix: %w", p, ErrInvalid)
	case p != p.Masked():
		return fmt.Errorf("%s has host bits set (network is %s): %w", p, p.Masked(), ErrInvalid)
	case p.Bits() == 0:
		return fmt.Errorf("%s covers the whole address family: %w", p, ErrInvalid)
	case p.Bits() == p.Addr().BitLen():
		return fmt.Errorf("%s leaves no room for pods: %w", p, ErrInvalid)
	}
	return nil
}

func checkMAC(mac net.HardwareAddr) error {
	switch {
	case mac == nil:
		return fmt.Errorf("not published yet: %w", ErrMissing)
	case len(mac) != 6:
		return fmt.Errorf("%s is not a 6-byte Ethernet address: %w", mac, ErrInvalid)
	case mac[0]&0x01 != 0 || bytes.Equal(mac, make(net.HardwareAddr, 6)):
		return fmt.Errorf("%s is not a unicast address: %w", mac, ErrInvalid)
	}
	return nil
}

// checkDevice accepts what the kernel accepts as a link name.
func checkDevice(name string) error {
	if name == "" || len(name) > 15 || name == "." || name == ".." ||
		strings.ContainsAny(name, "/: \t\n") {
		return fmt.Errorf("%q is not a valid link name: %w", name, ErrInvalid)
	}
	return nil
}

// minMTU is the smallest device MTU weft accepts: IPv6 needs 1280, and
// anything smaller is a configuration mistake for IPv4 too.
const minMTU = 1280

// ipipSettings is the IPIP device cfg asks for, or why it cannot be.
func ipipSettings(cfg Config) (IPIPDevice, []NodeError) {
	v := cfg.IPIP
	dev := IPIPDevice{Name: v.Device, MTU: v.MTU}
	if dev.Name == "" {
		dev.Name = DefaultIPIPDevice
	}
	self := cfg.Self.Name
	var errs []NodeError
	bad := func(field string, err error) { errs = append(errs, NodeError{self, field, err}) }
	if err := checkDevice(dev.Name); err != nil {
		bad("IPIP.Device", err)
	}
	ips, _ := addrsByFamily(cfg.Self.InternalIPs)
	dev.Local = ips[4]
	if !dev.Local.IsValid() {
		bad("InternalIPs", fmt.Errorf("no usable IPv4 address for the IPIP underlay: %w", ErrMissing))
	}
	if v.CrossSubnet && (!v.Subnet.IsValid() || !v.Subnet.Addr().Is4() || dev.Local.IsValid() && !v.Subnet.Contains(dev.Local)) {
		bad("IPIP.Subnet", fmt.Errorf("cross-subnet needs the node's IPv4 underlay subnet, holding %s (got %v): %w", dev.Local, v.Subnet, ErrInvalid))
	}
	if v.MTU < 0 || v.MTU != 0 && v.MTU < minMTU {
		bad("IPIP.MTU", fmt.Errorf("device MTU %d is below %d: %w", v.MTU, minMTU, ErrInvalid))
	}
	return dev, errs
}

// vxlanSettings validates cfg.VXLAN against Self and fills the defaults.
func vxlanSettings(cfg Config) (VXLANDevice, []NodeError) {
	v := cfg.VXLAN
	dev := VXLANDevice{Name: v.Device, VNI: v.VNI, Port: v.Port, MTU: v.MTU, MAC: cfg.Self.VTEPMAC}
	if dev.Name == "" {
		dev.Name = DefaultDevice
	}
	if dev.VNI == 0 {
		dev.VNI = DefaultVNI
	}
	if dev.Port == 0 {
		dev.Port = DefaultPort
	}
	if dev.MAC == nil {
		dev.MAC = VTEPMAC(cfg.Self.Name)
	}
	self := cfg.Self.Name
	var errs []NodeError
	bad := func(field string, err error) { errs = append(errs, NodeError{self, field, err}) }
	if err := checkDevice(dev.Name); err != nil {
		bad("VXLAN.Device", err)
	}
	if dev.VNI > 1<<24-1 {
		bad("VXLAN.VNI", fmt.Errorf("%d does not fit in 24 bits: %w", dev.VNI, ErrInvalid))
	}
	if err := checkMAC(dev.MAC); err != nil {
		bad("VTEPMAC", err)
	}
	ips, _ := addrsByFamily(cfg.Self.InternalIPs) // bad ones are reported by the caller
	uf := 6
	if _, ok := ips[4]; ok && !v.IPv6Underlay {
		uf = 4
	}
	dev.Local = ips[uf]
	if !dev.Local.IsValid() {
		bad("InternalIPs", fmt.Errorf("no usable %s address for the VXLAN underlay: %w", familyName(uf), ErrMissing))
	}
	if dev.MTU == 0 && v.UnderlayMTU != 0 {
		dev.MTU = v.UnderlayMTU - overhead(dev.Local)
	}
	if v.MTU < 0 || v.UnderlayMTU < 0 || dev.MTU != 0 && dev.MTU < minMTU {
		bad("VXLAN.MTU", fmt.Errorf("device MTU %d (underlay %d) is below %d: %w", dev.MTU, v.UnderlayMTU, minMTU, ErrInvalid))
	}
	return dev, errs
}

// overhead is the VXLAN encapsulation overhead over an underlay address.
func overhead(local netip.Addr) int {
	if local.Is4() {
		return OverheadIPv4
	}
	return OverheadIPv6
}
