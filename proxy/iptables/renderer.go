package iptables

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/weftnet/weft/proxy/model"
)

// Renderer renders one family's ruleset incrementally. It keeps what each
// service port rendered and, on Update, re-renders only the ports whose
// model objects changed: the tracker replaces a changed ServicePort or
// endpoint list and never mutates one, so pointer identity tells. Dispatch
// chains are rebuilt only for the buckets those ports touch. A sync after
// one EndpointSlice change therefore costs O(that service), not O(cluster).
type Renderer struct {
	cfg    Config
	family int
	base   []*Chain

	ports  map[model.ServicePortName]*portOut
	sorted []*portOut // ports by name, for a stable chain order

	vipMembers map[netip.Prefix]map[*portOut]bool
	npMembers  map[uint16]map[*portOut]bool
	rejecting  map[*portOut]bool
	vipChains  map[netip.Prefix]*Chain
	npChains   map[uint16]*Chain
	services   *Chain // WEFT-SERVICES
	nodePorts  *Chain // WEFT-NODEPORTS
	filterSvc  *Chain // WEFT-PROXY-SERVICES
	hairpin    map[string]int
	// cursor: the tracker's snapshot last rendered, whose Delta then names
	// the ports to look at.
	cursor model.Cursor
}

// NewRenderer returns a renderer for one family (4 or 6).
func NewRenderer(cfg Config, family int) *Renderer {
	return &Renderer{cfg: cfg, family: family, base: baseChains(cfg, family),
		ports: map[model.ServicePortName]*portOut{}, vipMembers: map[netip.Prefix]map[*portOut]bool{},
		npMembers: map[uint16]map[*portOut]bool{}, rejecting: map[*portOut]bool{},
		vipChains: map[netip.Prefix]*Chain{}, npChains: map[uint16]*Chain{}, hairpin: map[string]int{}}
}

// update is the bookkeeping of one Update call.
type update struct {
	vips       map[netip.Prefix]bool
	nports     map[uint16]bool
	rejects    bool
	hairpinWas map[string]int
}

// Update renders st, reusing what unchanged ports rendered before. The
// returned ruleset shares chains with earlier ones (chains are immutable).
func (r *Renderer) Update(st model.State) *Ruleset {
	u := &update{vips: map[netip.Prefix]bool{}, nports: map[uint16]bool{}, hairpinWas: map[string]int{}}
	// Few changes keep the port list sorted in place; many (a first sync)
	// re-sort it once at the end.
	resort := len(r.ports) == 0 || len(st.Ports) > 2*len(r.ports)
	if names, all := r.cursor.Next(st); !all {
		for name := range names {
			r.port(name, st, u, resort)
		}
	} else {
		for name := range st.Ports {
			r.port(name, st, u, resort)
		}
		for name := range r.ports {
			if _, ok := st.Ports[name]; !ok {
				r.port(name, st, u, resort)
			}
		}
	}
	if resort {
		r.sorted = r.sorted[:0]
		for _, o := range r.ports {
			r.sorted = append(r.sorted, o)
		}
		slices.SortFunc(r.sorted, byName)
	}
	r.dispatch(u)
	return r.ruleset(u)
}

// port renders the port name as st has it (or withdraws it) unless it is
// what was rendered.
func (r *Renderer) port(name model.ServicePortName, st model.State, u *update, resort bool) {
	sp, eps := st.Ports[name], st.Endpoints[name]
	old := r.ports[name]
	if old != nil && old.sp == sp && sameEndpoints(old.eps, eps) {
		return
	}
	var o *portOut
	if sp != nil {
		o = renderPort(r.cfg, r.family, sp, eps)
	}
	if old != nil {
		r.unlink(old, u)
	}
	if o != nil {
		r.link(o, u)
		r.ports[name] = o
	} else {
		delete(r.ports, name)
	}
	if !resort && (old != nil || o != nil) {
		r.place(old, o)
	}
}

func sameEndpoints(a, b []model.Endpoint) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// place replaces old by o (either may be nil) in the sorted port list.
func (r *Renderer) place(old, o *portOut) {
	key := old
	if key == nil {
		key = o
	}
	i, found := slices.BinarySearchFunc(r.sorted, key.name, func(p *portOut, name string) int { return cmp.Compare(p.name, name) })
	switch {
	case found && o != nil:
		r.sorted[i] = o
	case found:
		r.sorted = slices.Delete(r.sorted, i, i+1)
	case o != nil:
		r.sorted = slices.Insert(r.sorted, i, o)
	}
}

func (r *Renderer) link(o *portOut, u *update) { r.relink(o, u, true) }

func (r *Renderer) unlink(o *portOut, u *update) { r.relink(o, u, false) }

// relink adds or removes o's contributions to the shared chains and set.
func (r *Renderer) relink(o *portOut, u *update, add bool) {
	for b := range o.vips {
		u.vips[b] = true
		setMember(r.vipMembers, b, o, add)
	}
	for s := range o.nports {
		u.nports[s] = true
		setMember(r.npMembers, s, o, add)
	}
	if len(o.rejects) > 0 {
		u.rejects = true
		if add {
			r.rejecting[o] = true
		} else {
			delete(r.rejecting, o)
		}
	}
	for _, e := range o.hairpin {
		if _, seen := u.hairpinWas[e]; !seen {
			u.hairpinWas[e] = r.hairpin[e]
		}
		if add {
			r.hairpin[e]++
		} else if r.hairpin[e]--; r.hairpin[e] == 0 {
			delete(r.hairpin, e)
		}
	}
}

func setMember[K comparable](m map[K]map[*portOut]bool, k K, o *portOut, add bool) {
	if add {
		if m[k] == nil {
			m[k] = map[*portOut]bool{}
		}
		m[k][o] = true
		return
	}
	delete(m[k], o)
	if len(m[k]) == 0 {
		delete(m, k)
	}
}

// ruleset assembles the current chains: fixed ones, dispatch, then each
// port's chains in port order.
func (r *Renderer) ruleset(u *update) *Ruleset {
	rs := &Ruleset{Family: r.family, Jumps: BaseJumps()}
	rs.Chains = append(rs.Chains, r.base...)
	rs.Chains = append(rs.Chains, r.services, r.nodePorts, r.filterSvc)
	for _, b := range sortedKeysFunc(r.vipChains, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) }) {
		rs.Chains = append(rs.Chains, r.vipChains[b])
	}
	for _, s := range sortedKeysFunc(r.npChains, cmp.Compare[uint16]) {
		rs.Chains = append(rs.Chains, r.npChains[s])
	}
	for _, o := range r.sorted {
		rs.Chains = append(rs.Chains, o.chains...)
	}
	rs.hairpin = r.hairpin
	for _, e := range sortedKeysFunc(u.hairpinWas, cmp.Compare[string]) {
		was, now := u.hairpinWas[e] > 0, r.hairpin[e] > 0
		switch {
		case now && !was:
			rs.HairpinAdded = append(rs.HairpinAdded, e)
		case was && !now:
			rs.HairpinRemoved = append(rs.HairpinRemoved, e)
		}
	}
	return rs
}

func sortedKeysFunc[K comparable, V any](m map[K]V, less func(a, b K) int) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, less)
	return out
}
