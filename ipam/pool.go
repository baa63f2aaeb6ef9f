package ipam

import (
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"slices"
	"strings"
)

// ErrExhausted is wrapped by Allocate's error when a range set has no free
// address left.
var ErrExhausted = errors.New("address range exhausted")

// Pool is a validated, normalised list of range sets. It is immutable and
// safe for concurrent use; all allocation state lives in State.
type Pool struct {
	sets [][]poolRange
}

// poolRange is a normalised Range with precomputed allocation facts.
type poolRange struct {
	Range
	// reserved are the addresses in [RangeStart, RangeEnd] that are never
	// handed out, sorted.
	reserved []netip.Addr
	// size is the number of addresses in [RangeStart, RangeEnd]; usable
	// is size minus len(reserved). Both are exact (IPv6 ranges are huge).
	size, usable *big.Int
}

func (r *poolRange) isReserved(a netip.Addr) bool {
	_, found := slices.BinarySearchFunc(r.reserved, a, netip.Addr.Compare)
	return found
}

// NewPool validates sets and fills in defaults. Errors name the offending
// field by its JSON path in the plugin configuration, e.g.
// "ipam.ranges[0][1].subnet: 10.244.1.5/24 is not a network address".
//
// Within a set all ranges must be of one family; several sets may share a
// family. No two ranges anywhere in the pool may overlap. Every range must
// keep at least one address after the network address, the gateways and
// (IPv4) the broadcast address are excluded.
func NewPool(sets []RangeSet) (*Pool, error) {
	if len(sets) == 0 {
		return nil, errors.New("ipam.ranges: empty")
	}
	p := &Pool{sets: make([][]poolRange, len(sets))}
	for i, set := range sets {
		if len(set) == 0 {
			return nil, fmt.Errorf("ipam.ranges[%d]: empty", i)
		}
		for j, r := range set {
			n, err := r.normalise(rangePath(i, j))
			if err != nil {
				return nil, err
			}
			if j > 0 && n.Subnet.Addr().Is4() != p.sets[i][0].Subnet.Addr().Is4() {
				return nil, fmt.Errorf("ipam.ranges[%d]: mixes IPv4 and IPv6", i)
			}
			p.sets[i] = append(p.sets[i], poolRange{Range: n})
		}
	}
	if err := p.checkOverlaps(sets); err != nil {
		return nil, err
	}

	// A gateway is never handed out from any range, not only its own: two
	// ranges may split one subnet and share its gateway.
	var gateways []netip.Addr
	for i := range p.sets {
		for j := range p.sets[i] {
			gateways = append(gateways, p.sets[i][j].Gateway)
		}
	}
	gateways = sortAddrs(gateways)
	for i := range p.sets {
		for j := range p.sets[i] {
			r := &p.sets[i][j]
			r.reserved = r.reservedAddrs(gateways)
			r.size = span(r.RangeStart, r.RangeEnd)
			r.usable = new(big.Int).Sub(r.size, big.NewInt(int64(len(r.reserved))))
			if r.usable.Sign() <= 0 {
				return nil, fmt.Errorf("%s: no usable address in %s-%s (the network, gateway and broadcast addresses are never handed out)",
					rangePath(i, j), r.RangeStart, r.RangeEnd)
			}
		}
	}
	return p, nil
}

// checkOverlaps rejects any two overlapping ranges. orig is the user's
// input, used to word the error after the field the user actually wrote.
func (p *Pool) checkOverlaps(orig []RangeSet) error {
	type ref struct{ i, j int }
	var all []ref
	for i := range p.sets {
		for j := range p.sets[i] {
			all = append(all, ref{i, j})
		}
	}
	explicit := func(x ref) bool {
		r := orig[x.i][x.j]
		return r.RangeStart.IsValid() || r.RangeEnd.IsValid()
	}
	for n, a := range all {
		for _, b := range all[n+1:] {
			ra, rb := p.sets[a.i][a.j].Range, p.sets[b.i][b.j].Range
			if !ra.overlaps(rb) {
				continue
			}
			pa, pb := rangePath(a.i, a.j), rangePath(b.i, b.j)
			if !explicit(a) && !explicit(b) {
				return fmt.Errorf("%s.subnet: overlaps %s.subnet (%s and %s)", pb, pa, rb.Subnet, ra.Subnet)
			}
			return fmt.Errorf("%s: range %s-%s overlaps %s (range %s-%s)",
				pb, rb.RangeStart, rb.RangeEnd, pa, ra.RangeStart, ra.RangeEnd)
		}
	}
	return nil
}

// Sets returns a copy of the normalised range sets (defaults filled in).
func (p *Pool) Sets() []RangeSet {
	out := make([]RangeSet, len(p.sets))
	for i, set := range p.sets {
		out[i] = make(RangeSet, len(set))
		for j := range set {
			out[i][j] = set[j].Range
		}
	}
	return out
}

// Free returns the number of addresses that can still be handed out in
// each range set, in range-set order. It costs O(allocations), not
// O(addresses); a count that does not fit in a uint64 (IPv6 ranges larger
// than a /64) is reported as math.MaxUint64.
func (p *Pool) Free(st *State) []uint64 {
	used := make([]int64, len(p.sets))
	seen := make(map[netip.Addr]struct{})
	for _, al := range st.Allocations {
		for _, a := range al.Addresses {
			if _, dup := seen[a]; dup {
				continue
			}
			seen[a] = struct{}{}
			if i, _, ok := p.locate(a); ok {
				used[i]++
			}
		}
	}
	free := make([]uint64, len(p.sets))
	for i, set := range p.sets {
		n := big.NewInt(-used[i])
		for j := range set {
			n.Add(n, set[j].usable)
		}
		free[i] = clampUint64(n)
	}
	return free
}

// locate finds the range set and range that may hand out a. ok is false
// if a is outside every range or is reserved.
func (p *Pool) locate(a netip.Addr) (set int, r *poolRange, ok bool) {
	for i := range p.sets {
		if r, ok := p.usableIn(i, a); ok {
			return i, r, true
		}
	}
	return -1, nil, false
}

// usableIn returns the range of set i that may hand out a, if any.
func (p *Pool) usableIn(i int, a netip.Addr) (*poolRange, bool) {
	for j := range p.sets[i] {
		r := &p.sets[i][j]
		if r.holds(a) {
			return r, !r.isReserved(a)
		}
	}
	return nil, false
}

// setName describes set i for error messages:
// "ipam.ranges[0] (10.244.1.0/29)".
func (p *Pool) setName(i int) string {
	subnets := make([]string, len(p.sets[i]))
	for j := range p.sets[i] {
		subnets[j] = p.sets[i][j].Subnet.String()
	}
	return fmt.Sprintf("ipam.ranges[%d] (%s)", i, strings.Join(subnets, ", "))
}

func rangePath(i, j int) string { return fmt.Sprintf("ipam.ranges[%d][%d]", i, j) }

// sortAddrs sorts a in place, drops duplicates and returns it.
func sortAddrs(a []netip.Addr) []netip.Addr {
	slices.SortFunc(a, netip.Addr.Compare)
	return slices.Compact(a)
}
