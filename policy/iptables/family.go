package iptables

import "net/netip"

// family is what differs between the IPv4 and the IPv6 rulesets.
type family struct{ v6 bool }

func familyOf(n int) family { return family{v6: n == 6} }

func (f family) has(a netip.Addr) bool { return a.Is6() == f.v6 }

func (f family) setPrefix() string {
	if f.v6 {
		return setPrefix6
	}
	return SetPrefix
}

func (f family) tempPrefix() string {
	if f.v6 {
		return tempSetPrefix6
	}
	return tempSetPrefix
}

func (f family) host(a netip.Addr) string {
	if f.v6 {
		return a.String() + "/128"
	}
	return a.String() + "/32"
}

func (f family) ipset() string {
	if f.v6 {
		return "inet6"
	}
	return "inet"
}

func (f family) only(ips []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range ips {
		if f.has(a) {
			out = append(out, a)
		}
	}
	return out
}
