package ipam

import (
	"fmt"
	"math"
	"math/big"
	"net/netip"
)

// Range is one contiguous pool of addresses inside a subnet. Field names
// and JSON spelling follow the host-local IPAM plugin.
type Range struct {
	// Subnet is required and must be masked (10.244.1.0/24, not
	// 10.244.1.5/24).
	Subnet netip.Prefix `json:"subnet"`
	// RangeStart is the first address that may be handed out. Default:
	// the network address + 1.
	RangeStart netip.Addr `json:"rangeStart,omitzero"`
	// RangeEnd is the last address that may be handed out. Default: the
	// last address of the subnet, minus 1 for IPv4 (the broadcast address).
	RangeEnd netip.Addr `json:"rangeEnd,omitzero"`
	// Gateway is returned with every lease from this range and is never
	// handed out. Default: the network address + 1.
	Gateway netip.Addr `json:"gateway,omitzero"`
}

// RangeSet is a list of ranges of one IP family; a pod gets exactly one
// address from each RangeSet.
type RangeSet []Range

// normalise validates r and fills in its defaults. path is the JSON path
// of r in the user's configuration, e.g. "ipam.ranges[0][1]".
func (r Range) normalise(path string) (Range, error) {
	if !r.Subnet.IsValid() {
		return r, fmt.Errorf("%s.subnet: required", path)
	}
	network := r.Subnet.Addr()
	if network.Is4In6() {
		return r, fmt.Errorf("%s.subnet: %s: IPv4-mapped IPv6 subnets are not supported", path, r.Subnet)
	}
	if r.Subnet != r.Subnet.Masked() {
		return r, fmt.Errorf("%s.subnet: %s is not a network address (did you mean %s?)", path, r.Subnet, r.Subnet.Masked())
	}
	if hostBits := network.BitLen() - r.Subnet.Bits(); hostBits == 0 || (network.Is4() && hostBits == 1) {
		return r, fmt.Errorf("%s.subnet: %s is too small to hold any usable address", path, r.Subnet)
	}
	for _, f := range []struct {
		name string
		addr netip.Addr
	}{{"rangeStart", r.RangeStart}, {"rangeEnd", r.RangeEnd}, {"gateway", r.Gateway}} {
		if err := checkInSubnet(f.addr, r.Subnet); err != nil {
			return r, fmt.Errorf("%s.%s: %w", path, f.name, err)
		}
	}

	last := lastAddr(r.Subnet)
	var broadcast netip.Addr
	if network.Is4() {
		broadcast = last
	}
	if !r.RangeStart.IsValid() {
		r.RangeStart = network.Next()
	}
	if !r.RangeEnd.IsValid() {
		r.RangeEnd = last
		if broadcast.IsValid() {
			r.RangeEnd = last.Prev()
		}
	}
	if r.RangeStart.Compare(r.RangeEnd) > 0 {
		return r, fmt.Errorf("%s.rangeStart: %s is after rangeEnd %s", path, r.RangeStart, r.RangeEnd)
	}
	switch {
	case !r.Gateway.IsValid():
		r.Gateway = network.Next()
	case r.Gateway == network:
		return r, fmt.Errorf("%s.gateway: %s is the network address of %s", path, r.Gateway, r.Subnet)
	case r.Gateway == broadcast:
		return r, fmt.Errorf("%s.gateway: %s is the broadcast address of %s", path, r.Gateway, r.Subnet)
	}
	return r, nil
}

// checkInSubnet reports why a, if set, cannot be used inside subnet.
func checkInSubnet(a netip.Addr, subnet netip.Prefix) error {
	switch {
	case !a.IsValid():
		return nil
	case a.Zone() != "":
		return fmt.Errorf("%s must not have a zone", a)
	case !subnet.Contains(a):
		return fmt.Errorf("%s is outside subnet %s", a, subnet)
	}
	return nil
}

// reservedAddrs returns the addresses of r that are never handed out
// (network, IPv4 broadcast, and any of gateways) and that lie inside
// [RangeStart, RangeEnd], sorted and without duplicates.
func (r Range) reservedAddrs(gateways []netip.Addr) []netip.Addr {
	cand := append([]netip.Addr{r.Subnet.Addr()}, gateways...)
	if r.Subnet.Addr().Is4() {
		cand = append(cand, lastAddr(r.Subnet))
	}
	var out []netip.Addr
	for _, a := range cand {
		if r.holds(a) {
			out = append(out, a)
		}
	}
	return sortAddrs(out)
}

// holds reports whether a lies in [RangeStart, RangeEnd].
func (r Range) holds(a netip.Addr) bool {
	return a.BitLen() == r.RangeStart.BitLen() && a.Compare(r.RangeStart) >= 0 && a.Compare(r.RangeEnd) <= 0
}

// overlaps reports whether the two ranges share an address.
func (r Range) overlaps(o Range) bool {
	return r.RangeStart.BitLen() == o.RangeStart.BitLen() &&
		r.RangeStart.Compare(o.RangeEnd) <= 0 && o.RangeStart.Compare(r.RangeEnd) <= 0
}

// lastAddr returns the highest address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// span returns the number of addresses in [lo, hi] (lo <= hi, same
// family). It is exact: an IPv6 range may hold up to 2^128 addresses.
func span(lo, hi netip.Addr) *big.Int {
	n := new(big.Int).SetBytes(hi.AsSlice())
	n.Sub(n, new(big.Int).SetBytes(lo.AsSlice()))
	return n.Add(n, big.NewInt(1))
}

// clampUint64 returns n, or math.MaxUint64 if n does not fit.
func clampUint64(n *big.Int) uint64 {
	switch {
	case n.Sign() < 0:
		return 0
	case n.IsUint64():
		return n.Uint64()
	}
	return math.MaxUint64
}
