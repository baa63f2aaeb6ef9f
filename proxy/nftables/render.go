package nftables

import (
	"bytes"
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
	cfg   Config
	ports map[model.ServicePortName]*portOut
	// bySP and byEps find a rendered port by its ServicePort and by the
	// first element of its endpoint list: hashing a pointer is cheaper
	// than hashing a name, and an Update checks every port.
	bySP    map[*model.ServicePort]*portOut
	byEps   map[*model.Endpoint]*portOut
	epoch   uint64                  // Updates so far; a port's spSeen and epsSeen say when it was last found unchanged
	claims  map[frontend][]*portOut // the ports claiming each frontend (mostly one)
	winner  map[frontend]*portOut
	hairpin map[setKey]int // -> ports rendering it
	// lens are the number of elements of each set. A set's elements are
	// not kept apart from the ports' outputs (at 100k Services they would
	// take 300 MB more): the winners' elements are them, with the hairpin
	// ones (see each).
	lens map[string]int
	// members: for each set, the winning frontends with elements in it;
	// made when a sync needs whole sets, dropped by the next Update.
	members  map[string][]*frontendOut
	pending  map[string]map[packed]*change
	counts   map[int]map[int]int     // family -> endpoint count -> elements in its maps
	timeouts map[int]map[int]int     // family -> affinity seconds -> frontends
	affinity map[packed]*frontendOut // by frontend key
	sizes    lbSizes
	kinds    map[string]setKind // by set name, what count its elements add to
	stale    bool
	// cursor: the tracker's snapshot last rendered, whose Delta then names
	// the ports to look at.
	cursor model.Cursor
	// rendered: an Update happened. The first one records no changes (its
	// ruleset is applied in full), which spares a large first render
	// building and sorting a change per element.
	rendered bool
}

// NewRenderer returns a renderer that has rendered nothing yet.
func NewRenderer(cfg Config) *Renderer {
	return &Renderer{cfg: cfg, ports: map[model.ServicePortName]*portOut{}, bySP: map[*model.ServicePort]*portOut{},
		byEps: map[*model.Endpoint]*portOut{}, claims: map[frontend][]*portOut{},
		winner: map[frontend]*portOut{}, hairpin: map[setKey]int{}, lens: map[string]int{},
		pending: map[string]map[packed]*change{}, counts: map[int]map[int]int{4: {}, 6: {}},
		timeouts: map[int]map[int]int{4: {}, 6: {}}, affinity: map[packed]*frontendOut{}, sizes: lbSizes{},
		kinds: map[string]setKind{}}
}

// Adopt takes the size classes of the load-balancing maps a table already
// has (their kernel names, as listed), so that a restarted proxy keeps a
// map whose class still fits instead of filling a new one. Call it before
// the first Update.
func (r *Renderer) Adopt(kernelNames []string) {
	for _, k := range kernelNames {
		if m, e, ok := adoptSize(k); ok {
			r.sizes[m] = e
		}
	}
}

// setKey is an element's set and key.
type setKey struct {
	set string
	key packed
}

func sameSlice[T any](a, b []T) bool { return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0]) }

// Update renders st.
func (r *Renderer) Update(st model.State) *Ruleset {
	r.members = nil
	dirty := map[frontend]bool{}
	changed, gone := r.diff(st)
	for _, o := range gone {
		r.unindex(o)
		r.release(o, dirty)
		delete(r.ports, o.name)
	}
	// The ports render in parallel (pure), then join the renderer's state
	// in order.
	outs := make([]*portOut, len(changed))
	model.Parallel(len(changed), func(i int) {
		sp, eps, old := st.Ports[changed[i]], st.Endpoints[changed[i]], r.ports[changed[i]]
		if sp != nil && (old == nil || old.sp != sp || !sameSlice(old.eps, eps)) {
			outs[i] = renderPort(r.cfg, sp, eps)
		}
	})
	for i, n := range changed {
		o, old := outs[i], r.ports[n]
		if o == nil || old != nil && old.sp == o.sp && sameSlice(old.eps, o.eps) {
			continue // endpoints without a port, or a name listed twice
		}
		if old != nil {
			r.unindex(old)
			r.release(old, dirty)
		}
		r.ports[n] = o
		r.index(o)
		r.claim(o, dirty)
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
	r.resize(counts)
	rs := &Ruleset{Chains: chains(r.cfg, counts, timeouts, r.sizes), Sets: sets(r.cfg, counts, timeouts, r.sizes), source: r,
		changes: r.changes(), ChangesUnknown: !r.rendered, AffinityStale: r.stale, affinityValid: r.affinityValid}
	r.stale, r.rendered = false, true
	return rs
}

// resize gives each load-balancing map the size class its elements need
// (see lbSizes), and forgets those of maps that are gone.
func (r *Renderer) resize(counts map[int][]int) {
	want := map[string]bool{}
	for fam, ns := range counts {
		for _, n := range ns {
			for _, cluster := range []bool{false, true} {
				m := lbMap(cluster, fam, n)
				want[m] = true
				if e := nextSize(r.sizes[m], r.lens[m]); e != 0 {
					r.sizes[m] = e
				} else {
					delete(r.sizes, m)
				}
			}
		}
	}
	for m := range r.sizes {
		if !want[m] {
			delete(r.sizes, m)
		}
	}
}

// diff finds the names of the ports whose ServicePort or endpoint list is
// not the one rendered (a name may be listed twice), and the rendered ports
// st no longer has. When st follows the snapshot rendered last, its Delta
// names them; otherwise every port is compared, hashing pointers, not
// names, for the ports that did not change.
func (r *Renderer) diff(st model.State) (changed []model.ServicePortName, gone []*portOut) {
	if names, all := r.cursor.Next(st); !all {
		for n := range names {
			if _, ok := st.Ports[n]; ok {
				changed = append(changed, n)
			} else if o := r.ports[n]; o != nil {
				gone = append(gone, o)
			}
		}
		return changed, gone
	}
	r.epoch++
	for n, sp := range st.Ports {
		if o := r.bySP[sp]; o != nil && o.name == n {
			o.spSeen = r.epoch
		} else {
			changed = append(changed, n)
		}
	}
	for n, eps := range st.Endpoints {
		if len(eps) == 0 {
			continue
		}
		if o := r.byEps[&eps[0]]; o != nil && o.name == n && len(o.eps) == len(eps) {
			o.epsSeen = r.epoch
		} else {
			changed = append(changed, n)
		}
	}
	for n, o := range r.ports {
		switch {
		case o.spSeen != r.epoch: // changed (listed above) or gone
			if _, ok := st.Ports[n]; !ok {
				gone = append(gone, o)
			}
		case len(o.eps) > 0 && o.epsSeen != r.epoch:
			changed = append(changed, n) // its endpoints are gone
		}
	}
	return changed, gone
}

func (r *Renderer) index(o *portOut) {
	r.bySP[o.sp] = o
	if len(o.eps) > 0 {
		r.byEps[&o.eps[0]] = o
	}
}

func (r *Renderer) unindex(o *portOut) {
	if r.bySP[o.sp] == o {
		delete(r.bySP, o.sp)
	}
	if len(o.eps) > 0 && r.byEps[&o.eps[0]] == o {
		delete(r.byEps, &o.eps[0])
	}
}

func (r *Renderer) claim(o *portOut, dirty map[frontend]bool) {
	for _, fe := range o.order {
		if !slices.Contains(r.claims[fe], o) {
			r.claims[fe] = append(r.claims[fe], o)
		}
		dirty[fe] = true
	}
	for h := range o.hairpin.all() {
		k := setKey{h.set, h.key}
		if r.hairpin[k]++; r.hairpin[k] == 1 {
			r.put(h)
		}
	}
}

func (r *Renderer) release(o *portOut, dirty map[frontend]bool) {
	for _, fe := range o.order {
		if c := slices.DeleteFunc(r.claims[fe], func(p *portOut) bool { return p == o }); len(c) > 0 {
			r.claims[fe] = c
		} else {
			delete(r.claims, fe)
		}
		dirty[fe] = true
	}
	for h := range o.hairpin.all() {
		k := setKey{h.set, h.key}
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
	for _, o := range r.claims[fe] {
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
		was = prev.out(fe)
		for e := range was.elems.all() {
			r.remove(e)
		}
	}
	key := fe.key()
	delete(r.affinity, key)
	delete(r.winner, fe)
	if owner != nil {
		now = owner.out(fe)
		r.winner[fe] = owner
		for e := range now.elems.all() {
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
func (r *Renderer) affinityValid(seconds int, fe packed, backend packedValue) bool {
	fo := r.affinity[fe]
	return fo != nil && fo.affinity == seconds && fo.backends[backend]
}

// put adds e, which the table lacks: a set's keys start with their
// frontend's (a frontend's elements come from its winner alone), but for
// the hairpin ones, which are counted per port (claim, release).
func (r *Renderer) put(e elem) {
	r.lens[e.set]++
	r.count(e.set, 1)
	r.record(e.set, e.key, packedValue{}, false, e.value, true)
}

// remove takes e, which the table has, away.
func (r *Renderer) remove(e elem) {
	if r.lens[e.set]--; r.lens[e.set] == 0 {
		delete(r.lens, e.set)
	}
	r.count(e.set, -1)
	r.record(e.set, e.key, e.value, true, packedValue{}, false)
}

// each calls f with every element of set (by the renderer's name), in no
// particular order.
func (r *Renderer) each(set string, f func(packed, packedValue)) {
	if r.members == nil {
		r.members = map[string][]*frontendOut{}
		for fe, o := range r.winner {
			w := o.out(fe)
			for e := range w.elems.all() {
				if l := r.members[e.set]; len(l) == 0 || l[len(l)-1] != w {
					r.members[e.set] = append(l, w)
				}
			}
		}
	}
	for _, w := range r.members[set] {
		for e := range w.elems.all() {
			if e.set == set {
				f(e.key, e.value)
			}
		}
	}
	for k := range r.hairpin {
		if k.set == set {
			f(k.key, packedValue{})
		}
	}
}

// count keeps the number of elements of the maps of each endpoint count
// and of the affinity sets of each timeout, which decide the maps and
// rules beyond the preset ones.
func (r *Renderer) count(set string, d int) {
	k, ok := r.kinds[set]
	if !ok {
		k = kindOf(r.cfg, set)
		r.kinds[set] = k
	}
	switch {
	case k.timeout:
		r.timeouts[k.fam][k.n] += d
	case k.fam != 0:
		r.counts[k.fam][k.n] += d
	}
}

// setKind says what count a set's elements add to: the endpoint count n
// of a load-balancing map, or the timeout n of an affinity set, of family
// fam (0: none).
type setKind struct {
	fam, n  int
	timeout bool
}

func kindOf(cfg Config, set string) setKind {
	for _, fam := range cfg.families() {
		if n, ok := suffixInt(set, name("lb", fam)+"-"); ok {
			return setKind{fam: fam, n: n}
		} else if n, ok := suffixInt(set, name("lb-cluster", fam)+"-"); ok {
			return setKind{fam: fam, n: n}
		} else if n, ok := suffixInt(set, name("affinity", fam)+"-"); ok {
			return setKind{fam: fam, n: n, timeout: true}
		}
	}
	return setKind{}
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

func (r *Renderer) record(set string, key packed, old packedValue, had bool, now packedValue, has bool) {
	if !r.rendered {
		return
	}
	m := r.pending[set]
	if m == nil {
		m = map[packed]*change{}
		r.pending[set] = m
	}
	c := m[key]
	if c == nil {
		c = &change{set: set, key: key, old: old, had: had}
		m[key] = c
	}
	c.new, c.has = now, has
}

// changes returns the pending changes that change something, sorted, and
// forgets them.
func (r *Renderer) changes() []change {
	var out []change
	for _, m := range r.pending {
		for _, c := range m {
			if c.had == c.has && (!c.has || c.old == c.new) {
				continue
			}
			out = append(out, *c)
		}
	}
	clear(r.pending)
	slices.SortFunc(out, func(a, b change) int {
		return cmp.Or(cmp.Compare(a.set, b.set), bytes.Compare(a.key.bytes(), b.key.bytes()))
	})
	return out
}
