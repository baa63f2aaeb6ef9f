package nftables

import (
	"cmp"
	"slices"
	"strings"

	"github.com/weftnet/weft/proxy/model"
)

// Render turns the model into the desired content of the table. It is pure.
func Render(cfg Config, st model.State) *Ruleset { return NewRenderer(cfg).Update(st) }

// Renderer renders the model incrementally: Update re-renders only the
// service ports whose ServicePort or endpoint list is not the one it saw
// last (the tracker shares unchanged ones between snapshots), and reports
// the element changes since the previous Update.
//
// Two service ports may claim one frontend (an externalIP that is another
// Service's ClusterIP, a NodePort used twice): the port first by name owns
// it, as a deterministic choice; the other's elements for it are left out.
type Renderer struct {
	cfg      Config
	ports    map[model.ServicePortName]*portOut
	claims   map[frontend]map[*portOut]bool
	winner   map[frontend]*portOut
	hairpin  map[string]int // "set key" -> ports rendering it
	elements map[string]map[string]Element
	pending  map[string]map[string]*Change
	counts   map[int]map[int]int // family -> endpoint count -> elements in its maps
	timeouts map[int]map[int]int // family -> affinity seconds -> frontends
	affinity map[string]*frontendOut
	stale    bool
}

// NewRenderer returns a renderer that has rendered nothing yet.
func NewRenderer(cfg Config) *Renderer {
	return &Renderer{cfg: cfg, ports: map[model.ServicePortName]*portOut{}, claims: map[frontend]map[*portOut]bool{},
		winner: map[frontend]*portOut{}, hairpin: map[string]int{}, elements: map[string]map[string]Element{},
		pending: map[string]map[string]*Change{}, counts: map[int]map[int]int{4: {}, 6: {}},
		timeouts: map[int]map[int]int{4: {}, 6: {}}, affinity: map[string]*frontendOut{}}
}

func sameSlice[T any](a, b []T) bool { return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0]) }

// Update renders st.
func (r *Renderer) Update(st model.State) *Ruleset {
	dirty := map[frontend]bool{}
	for n, sp := range st.Ports {
		eps := st.Endpoints[n]
		old := r.ports[n]
		if old != nil && old.sp == sp && sameSlice(old.eps, eps) {
			continue
		}
		if old != nil {
			r.release(old, dirty)
		}
		o := renderPort(r.cfg, sp, eps)
		r.ports[n] = o
		r.claim(o, dirty)
	}
	for n, o := range r.ports {
		if _, ok := st.Ports[n]; !ok {
			r.release(o, dirty)
			delete(r.ports, n)
		}
	}
	for fe := range dirty {
		r.resolve(fe)
	}
	counts, timeouts := map[int][]int{}, map[int][]int{}
	preset := make([]int, presetCounts)
	for i := range preset {
		preset[i] = i + 1
	}
	for _, fam := range r.cfg.families() {
		counts[fam] = sortedInts(r.counts[fam], preset...)
		if !hashedAffinity(fam) {
			timeouts[fam] = sortedInts(r.timeouts[fam], defaultAffinitySeconds)
		}
	}
	rs := &Ruleset{Chains: chains(r.cfg, counts, timeouts), Sets: sets(r.cfg, counts, timeouts), Elements: r.elements,
		Changes: r.changes(), AffinityStale: r.stale, affinityValid: r.affinityValid}
	r.stale = false
	return rs
}

func (r *Renderer) claim(o *portOut, dirty map[frontend]bool) {
	for _, fe := range o.order {
		if r.claims[fe] == nil {
			r.claims[fe] = map[*portOut]bool{}
		}
		r.claims[fe][o] = true
		dirty[fe] = true
	}
	for _, h := range o.hairpin {
		k := h.set + " " + h.keyString()
		if r.hairpin[k]++; r.hairpin[k] == 1 {
			r.put(h)
		}
	}
}

func (r *Renderer) release(o *portOut, dirty map[frontend]bool) {
	for _, fe := range o.order {
		delete(r.claims[fe], o)
		if len(r.claims[fe]) == 0 {
			delete(r.claims, fe)
		}
		dirty[fe] = true
	}
	for _, h := range o.hairpin {
		k := h.set + " " + h.keyString()
		if r.hairpin[k]--; r.hairpin[k] == 0 {
			delete(r.hairpin, k)
			r.remove(h)
		}
	}
}

// resolve installs the elements of fe's owner, replacing those of its
// previous owner.
func (r *Renderer) resolve(fe frontend) {
	var owner *portOut
	for o := range r.claims[fe] {
		if owner == nil || compareNames(o.name, owner.name) < 0 {
			owner = o
		}
	}
	prev := r.winner[fe]
	if prev == owner {
		return
	}
	var was, now *frontendOut
	if prev != nil {
		was = prev.fes[fe]
		for _, e := range was.elems {
			r.remove(e)
		}
	}
	key := strings.Join(fe.key(), " . ")
	delete(r.affinity, key)
	delete(r.winner, fe)
	if owner != nil {
		now = owner.fes[fe]
		r.winner[fe] = owner
		for _, e := range now.elems {
			r.put(e)
		}
		if now.affinity > 0 {
			r.affinity[key] = now
		}
	}
	if was != nil && was.affinity > 0 {
		if now == nil || now.affinity != was.affinity {
			r.stale = true
		}
		for b := range was.backends {
			r.stale = r.stale || now == nil || !now.backends[b]
		}
	}
}

func compareNames(a, b model.ServicePortName) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.Port, b.Port),
		cmp.Compare(a.Protocol, b.Protocol))
}

// affinityValid: an entry (client . frontend -> backend) of the client map
// of timeout seconds may stay while the frontend has affinity with that
// timeout and the backend is one of its endpoints.
func (r *Renderer) affinityValid(seconds int, key, value []string) bool {
	if len(key) != 4 {
		return false
	}
	fo := r.affinity[strings.Join(key[1:], " . ")]
	return fo != nil && fo.affinity == seconds && fo.backends[strings.Join(value, " . ")]
}

func (r *Renderer) put(e elem) {
	m := r.elements[e.set]
	if m == nil {
		m = map[string]Element{}
		r.elements[e.set] = m
	}
	ks := e.keyString()
	old, had := m[ks]
	m[ks] = Element{Key: e.key, Value: e.value}
	if !had {
		r.count(e.set, 1)
	}
	r.record(e.set, ks, e.key, old.Value, had, e.value, true)
}

func (r *Renderer) remove(e elem) {
	m := r.elements[e.set]
	ks := e.keyString()
	old, had := m[ks]
	if !had {
		return
	}
	delete(m, ks)
	if len(m) == 0 {
		delete(r.elements, e.set)
	}
	r.count(e.set, -1)
	r.record(e.set, ks, e.key, old.Value, true, nil, false)
}

// count keeps the number of elements of the maps of each endpoint count
// and of the affinity sets of each timeout, which decide the maps and
// rules beyond the preset ones.
func (r *Renderer) count(set string, d int) {
	for _, fam := range r.cfg.families() {
		if n, ok := suffixInt(set, name("lb", fam)+"-"); ok {
			r.counts[fam][n] += d
		} else if n, ok := suffixInt(set, name("lb-cluster", fam)+"-"); ok {
			r.counts[fam][n] += d
		} else if n, ok := suffixInt(set, name("affinity", fam)+"-"); ok {
			r.timeouts[fam][n] += d
		}
	}
}

func suffixInt(s, prefix string) (int, bool) {
	rest, ok := strings.CutPrefix(s, prefix)
	if !ok || rest == "" {
		return 0, false
	}
	n := 0
	for _, c := range rest {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

func (r *Renderer) record(set, ks string, key, old []string, had bool, now []string, has bool) {
	m := r.pending[set]
	if m == nil {
		m = map[string]*Change{}
		r.pending[set] = m
	}
	c := m[ks]
	if c == nil {
		c = &Change{Set: set, Key: key, Old: old, Had: had}
		m[ks] = c
	}
	c.New, c.Has = now, has
}

// changes returns the pending changes that change something, sorted, and
// forgets them.
func (r *Renderer) changes() []Change {
	var out []Change
	for _, m := range r.pending {
		for _, c := range m {
			if c.Had == c.Has && (!c.Has || slices.Equal(c.Old, c.New)) {
				continue
			}
			out = append(out, *c)
		}
	}
	clear(r.pending)
	slices.SortFunc(out, func(a, b Change) int {
		return cmp.Or(cmp.Compare(a.Set, b.Set), slices.Compare(a.Key, b.Key))
	})
	return out
}
