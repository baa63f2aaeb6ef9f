// Package cliflag holds the flag types weft's commands share: repeatable,
// comma-separable lists of addresses, CIDRs and names, parsed (and rejected with
// the flag's name) when the command line is read.
package cliflag

import (
	"net/netip"
	"strings"
)

// Addrs is a repeatable, comma-separable list of IP addresses.
type Addrs []netip.Addr

func (a *Addrs) String() string { return join(*a) }

// Set parses and appends each address of v.
func (a *Addrs) Set(v string) error {
	for _, s := range split(v) {
		ip, err := netip.ParseAddr(s)
		if err != nil {
			return err
		}
		*a = append(*a, ip)
	}
	return nil
}

// Prefixes is a repeatable, comma-separable list of CIDRs, kept masked.
type Prefixes []netip.Prefix

func (p *Prefixes) String() string { return join(*p) }

// Set parses and appends each CIDR of v.
func (p *Prefixes) Set(v string) error {
	for _, s := range split(v) {
		pfx, err := netip.ParsePrefix(s)
		if err != nil {
			return err
		}
		*p = append(*p, pfx.Masked())
	}
	return nil
}

// Names is a repeatable, comma-separable list of names (e.g. links).
type Names []string

func (n *Names) String() string { return strings.Join(*n, ",") }

// Set appends each name of v.
func (n *Names) Set(v string) error {
	*n = append(*n, split(v)...)
	return nil
}

func split(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func join[T interface{ String() string }](xs []T) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = x.String()
	}
	return strings.Join(parts, ",")
}
