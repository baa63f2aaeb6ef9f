package model

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// parseIP parses an address the way the API server accepts it: the usual
// forms, plus the legacy IPv4 form with leading zeros ("010.0.0.1"), which
// older objects may still carry and which Kubernetes reads as decimal. It
// refuses zones and IPv4-mapped IPv6 addresses, which name no family.
func parseIP(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		var ok bool
		if a, ok = parseLegacyIPv4(s); !ok {
			return netip.Addr{}, fmt.Errorf("%q is not an IP address: %w", s, ErrInvalid)
		}
	}
	switch {
	case a.Zone() != "":
		return netip.Addr{}, fmt.Errorf("%q has a zone: %w", s, ErrInvalid)
	case a.Is4In6():
		return netip.Addr{}, fmt.Errorf("%q is IPv4-mapped, give the IPv4 address: %w", s, ErrInvalid)
	}
	return a, nil
}

// parseLegacyIPv4 reads four decimal octets, leading zeros allowed.
func parseLegacyIPv4(s string) (netip.Addr, bool) {
	parts := strings.Split(s, ".")
	if len(parts) != 4 {
		return netip.Addr{}, false
	}
	var b [4]byte
	for i, p := range parts {
		if p == "" || strings.TrimLeft(p, "0123456789") != "" {
			return netip.Addr{}, false
		}
		n, err := strconv.ParseUint(p, 10, 8)
		if err != nil {
			return netip.Addr{}, false
		}
		b[i] = byte(n)
	}
	return netip.AddrFrom4(b), true
}

// parseCIDR parses "address/bits" (with parseIP's address forms) and masks
// it: Kubernetes accepts host bits in a range and ignores them.
func parseCIDR(s string) (netip.Prefix, error) {
	addr, bits, ok := strings.Cut(s, "/")
	if !ok {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR (no prefix length): %w", s, ErrInvalid)
	}
	a, err := parseIP(addr)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR: %w", s, err)
	}
	n, err := strconv.ParseUint(bits, 10, 8)
	if err != nil || int(n) > a.BitLen() {
		return netip.Prefix{}, fmt.Errorf("%q has a bad prefix length: %w", s, ErrInvalid)
	}
	return netip.PrefixFrom(a, int(n)).Masked(), nil
}

// validPort reports whether p is a port number (1..65535).
func validPort(p int32) bool { return p >= 1 && p <= 65535 }
