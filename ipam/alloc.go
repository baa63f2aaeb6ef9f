package ipam

import (
	"errors"
	"fmt"
	"math/big"
	"net/netip"
)

// Allocate returns the leases for key, one per range set, in range-set
// order.
//
// If key already holds an address in every range set, the same addresses
// are returned and st is not modified (a repeated CNI ADD is idempotent).
// Addresses of key that no longer fit the pool (the configuration
// changed) are replaced; those that still fit are kept. A new address is
// the first free one after the address last handed out in its set,
// wrapping around through all the ranges of the set, so a just-released
// address is not reused at once.
//
// If any set is exhausted the error wraps ErrExhausted, names the set,
// and st is unchanged.
func (p *Pool) Allocate(st *State, key Key) ([]Lease, error) {
	if key.ContainerID == "" || key.IfName == "" {
		return nil, fmt.Errorf("allocate %q: container ID and interface name are required", key)
	}
	idx := st.find(key)
	var old []netip.Addr
	if idx >= 0 {
		old = st.Allocations[idx].Addresses
	}

	// Keep every old address that still fits its set.
	addrs := make([]netip.Addr, len(p.sets))
	unchanged := idx >= 0 && len(old) == len(p.sets)
	for i := range p.sets {
		for k, a := range old {
			if _, ok := p.usableIn(i, a); ok {
				addrs[i] = a
				unchanged = unchanged && k == i
				break
			}
		}
		unchanged = unchanged && addrs[i].IsValid()
	}
	if unchanged {
		return p.leases(addrs), nil
	}

	used := make(map[netip.Addr]struct{})
	for n, al := range st.Allocations {
		if n == idx {
			continue
		}
		for _, a := range al.Addresses {
			used[a] = struct{}{}
		}
	}
	for _, a := range addrs {
		if a.IsValid() {
			used[a] = struct{}{}
		}
	}
	picked := make([]bool, len(p.sets))
	for i := range p.sets {
		if addrs[i].IsValid() {
			continue
		}
		a, ok := p.pick(i, st.last(i), used)
		if !ok {
			return nil, fmt.Errorf("%s: no free address: %w", p.setName(i), ErrExhausted)
		}
		addrs[i], picked[i] = a, true
		used[a] = struct{}{}
	}

	// Commit: nothing above modified st.
	st.put(key, addrs)
	for i, ok := range picked {
		if ok {
			st.setLast(i, len(p.sets), addrs[i])
		}
	}
	return p.leases(addrs), nil
}

// pick returns the first address of set i after last that is neither
// reserved nor in used, wrapping around the set's ranges. If last is not
// in the set, the search starts at the set's first address.
func (p *Pool) pick(i int, last netip.Addr, used map[netip.Addr]struct{}) (netip.Addr, bool) {
	set := p.sets[i]
	ri, cur := 0, set[0].RangeStart
	// Among len(used)+reserved+1 distinct addresses of the set at least
	// one is free, so the walk is bounded by the number of taken addresses,
	// not by the size of the set; a smaller set is walked exactly once.
	limit := uint64(len(used)) + 1
	ring := new(big.Int)
	for j := range set {
		ring.Add(ring, set[j].size)
		limit += uint64(len(set[j].reserved))
		if last.IsValid() && set[j].holds(last) {
			ri, cur = p.advance(i, j, last)
		}
	}
	if ring.IsUint64() {
		limit = min(limit, ring.Uint64())
	}
	for range limit {
		if _, taken := used[cur]; !taken && !set[ri].isReserved(cur) {
			return cur, true
		}
		ri, cur = p.advance(i, ri, cur)
	}
	return netip.Addr{}, false
}

// advance steps from cur in range ri of set i to the next address of the
// set, moving to the next range (and from the last range to the first)
// at the end of a range.
func (p *Pool) advance(i, ri int, cur netip.Addr) (int, netip.Addr) {
	set := p.sets[i]
	if cur == set[ri].RangeEnd {
		ri = (ri + 1) % len(set)
		return ri, set[ri].RangeStart
	}
	return ri, cur.Next()
}

// Release removes key's allocation and reports whether there was one. The
// rotation position is kept, so the released addresses are not reused
// immediately.
func (p *Pool) Release(st *State, key Key) bool {
	idx := st.find(key)
	if idx < 0 {
		return false
	}
	st.remove(idx)
	return true
}

// Lookup returns key's leases. ok is false if key has no allocation or if
// its allocation no longer fits the pool (Allocate would replace it).
func (p *Pool) Lookup(st *State, key Key) (leases []Lease, ok bool) {
	idx := st.find(key)
	if idx < 0 {
		return nil, false
	}
	addrs := st.Allocations[idx].Addresses
	if len(addrs) != len(p.sets) {
		return nil, false
	}
	for i, a := range addrs {
		if _, ok := p.usableIn(i, a); !ok {
			return nil, false
		}
	}
	return p.leases(addrs), true
}

// leases builds the leases for addrs, addrs[i] being usable in set i.
func (p *Pool) leases(addrs []netip.Addr) []Lease {
	out := make([]Lease, len(addrs))
	for i, a := range addrs {
		r, ok := p.usableIn(i, a)
		if !ok {
			panic(errors.New("ipam: internal error: lease outside its range set"))
		}
		out[i] = Lease{Address: netip.PrefixFrom(a, r.Subnet.Bits()), Gateway: r.Gateway}
	}
	return out
}
