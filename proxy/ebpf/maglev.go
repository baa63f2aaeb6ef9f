package ebpf

import (
	"hash/fnv"
	"net/netip"
	"slices"
)

// maglevSizes are the Maglev table sizes (primes): a frontend with n
// backends uses the first one of at least 1000*n (the last beyond that),
// which keeps a backend change from moving more than 1 % of the other
// backends' flows (measured: about 100*n gives 2-5 %). bpf/nodeport.c
// holds the same list.
var maglevSizes = []uint32{1021, 2039, 4093, 8191, 16381, 32749, 65521}

// maglevSize is the table size for n backends.
func maglevSize(n int) uint32 {
	for _, m := range maglevSizes {
		if uint64(m) >= 1000*uint64(n) {
			return m
		}
	}
	return maglevSizes[len(maglevSizes)-1]
}

// maglevTable fills a table of m entries with indexes into backends by
// Maglev's consistent hashing: each backend walks its own permutation of
// the entries (an offset and a skip from hashes of its address, the same
// on every node), and the backends, in address order, take turns claiming
// the next free entry of their walk; so the table does not depend on the
// order of backends. It is pure.
func maglevTable(backends []netip.AddrPort, m uint32) []int {
	n := len(backends)
	table := make([]int, m)
	if n == 0 {
		return table
	}
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return backends[a].Compare(backends[b]) })
	for i := range table {
		table[i] = -1
	}
	offset, skip, next := make([]uint64, n), make([]uint64, n), make([]uint64, n)
	for i, b := range backends {
		offset[i] = maglevHash(b, 'o') % uint64(m)
		skip[i] = maglevHash(b, 's')%uint64(m-1) + 1
	}
	for filled := uint32(0); ; {
		for _, i := range order {
			c := (offset[i] + next[i]*skip[i]) % uint64(m)
			for table[c] >= 0 {
				next[i]++
				c = (offset[i] + next[i]*skip[i]) % uint64(m)
			}
			table[c] = i
			next[i]++
			if filled++; filled == m {
				return table
			}
		}
	}
}

func maglevHash(b netip.AddrPort, salt byte) uint64 {
	h := fnv.New64a()
	a := b.Addr().Unmap().As16()
	_, _ = h.Write(a[:])
	_, _ = h.Write([]byte{byte(b.Port() >> 8), byte(b.Port()), salt})
	return h.Sum64()
}
