package iptables

import (
	"net/netip"
	"slices"

	"github.com/weftnet/weft/policy/tierbox"
)

// setEntries writes a union of peer blocks as hash:net entries ("prefix"
// or "prefix nomatch"), which the kernel judges most specific prefix
// first. Every prefix the blocks name cuts the address space into regions
// that each block holds wholly or not at all, so a prefix's entry is
// exact: a region inside it belongs to the union when some block has a
// net holding the prefix and no exception holding it. Entries that agree
// with the nearest enclosing prefix are left out. /0, which the hash
// types lack, is written as its two halves.
func setEntries(blocks []tierbox.Block) []string {
	type mark struct{ in, out []int } // blocks naming the prefix as net / exception
	marks := map[netip.Prefix]*mark{}
	at := func(p netip.Prefix) *mark {
		m, ok := marks[p]
		if !ok {
			m = &mark{}
			marks[p] = m
		}
		return m
	}
	for i, b := range blocks {
		for _, n := range b.Nets {
			at(n).in = append(at(n).in, i)
		}
		for _, e := range b.Except {
			at(e).out = append(at(e).out, i)
		}
	}
	named := make([]netip.Prefix, 0, len(marks))
	for p := range marks {
		named = append(named, p)
	}
	var prefixes []netip.Prefix
	for _, p := range named {
		if p.Bits() == 0 {
			lo := netip.PrefixFrom(p.Addr(), 1)
			hi := netip.PrefixFrom(tierbox.PrefixRange(p).Hi, 1).Masked()
			at(lo)
			at(hi)
			prefixes = append(prefixes, lo, hi)
			continue
		}
		prefixes = append(prefixes, p)
	}
	slices.SortFunc(prefixes, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	prefixes = slices.Compact(prefixes)
	member := func(p netip.Prefix) bool {
		in, out := map[int]bool{}, map[int]bool{}
		for bits := 0; bits <= p.Bits(); bits++ {
			if m, ok := marks[netip.PrefixFrom(p.Addr(), bits).Masked()]; ok {
				for _, i := range m.in {
					in[i] = true
				}
				for _, i := range m.out {
					out[i] = true
				}
			}
		}
		for i := range in {
			if !out[i] {
				return true
			}
		}
		return false
	}
	enclosing := func(p netip.Prefix) bool { // membership of the nearest enclosing prefix
		for bits := p.Bits() - 1; bits >= 1; bits-- {
			if q := netip.PrefixFrom(p.Addr(), bits).Masked(); marks[q] != nil {
				return member(q)
			}
		}
		return false
	}
	var out []string
	for _, p := range prefixes {
		m := member(p)
		if m == enclosing(p) {
			continue
		}
		if m {
			out = append(out, p.String())
		} else {
			out = append(out, p.String()+" nomatch")
		}
	}
	return out
}
