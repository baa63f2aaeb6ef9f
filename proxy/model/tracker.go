package model

import (
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Tracker keeps the latest Services and EndpointSlices, fed by informer
// events, and turns them into State on demand. Any number of events between
// two snapshots coalesce: Snapshot rebuilds only the Services that events
// touched (with their slices) and compares the result with the previous
// snapshot, so an event that changes nothing reports nothing. It is safe
// for concurrent use.
//
// A snapshot costs O(what changed): the tracker keeps one State and edits
// its maps in place (it never mutates a ServicePort or an endpoint list, it
// replaces them), and hands out each change with what the previous snapshot
// had (State.Delta). So a State's maps are valid until the next Snapshot,
// which edits them; the ServicePorts and endpoint lists they point to stay
// valid for good.
type Tracker struct {
	mu    sync.Mutex // guards x and dirty
	x     *index
	dirty map[key]struct{}

	snap    sync.Mutex // serialises Snapshot; guards the fields below
	state   State
	version uint64                    // of state; 0 before the first snapshot
	ports   map[key][]ServicePortName // by Service key, in state (a slice: a map per Service costs ~1 KiB)
	errs    map[key][]ObjectError     // by Service key, as built
}

// versions numbers snapshots across all trackers, so that a consumer fed
// by two trackers never takes one's delta for the other's.
var versions atomic.Uint64

// NewTracker returns an empty Tracker.
func NewTracker() *Tracker {
	return &Tracker{
		x:     newIndex(),
		dirty: map[key]struct{}{},
		state: State{Ports: map[ServicePortName]*ServicePort{}, Endpoints: map[ServicePortName][]Endpoint{}},
		ports: map[key][]ServicePortName{},
		errs:  map[key][]ObjectError{},
	}
}

// OnService records an add (old nil), update or delete (new nil). The
// Tracker keeps the pointer: the object must not be modified afterwards, as
// informers guarantee.
func (t *Tracker) OnService(old, new *corev1.Service) {
	obj := firstNonNil(new, old)
	if obj == nil {
		return
	}
	k := keyOf(obj.Namespace, obj.Name)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.x.setService(k, new)
	t.dirty[k] = struct{}{}
}

// OnEndpointSlice records an add (old nil), update or delete (new nil). A
// slice relabelled to another Service leaves the old one's group and joins
// the new one's, and both are rebuilt.
func (t *Tracker) OnEndpointSlice(old, new *discoveryv1.EndpointSlice) {
	obj := firstNonNil(new, old)
	if obj == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, k := range t.x.setSlice(keyOf(obj.Namespace, obj.Name), new) {
		t.dirty[k] = struct{}{}
	}
}

// Snapshot returns the current State, which equals Build over the objects
// the Tracker holds, with its Delta: the service ports that changed since
// the previous Snapshot (added, removed, or with a different ServicePort
// or endpoint list); and every current ObjectError, in Build's order (the
// complete set, not just the new ones). The State is the tracker's: read
// only, and its maps are valid until the next Snapshot.
func (t *Tracker) Snapshot() (State, []ObjectError) {
	t.snap.Lock()
	defer t.snap.Unlock()

	type job struct {
		k   key
		svc *corev1.Service
		esl []*discoveryv1.EndpointSlice
	}
	t.mu.Lock()
	jobs := make([]job, 0, len(t.dirty))
	for k := range t.dirty {
		jobs = append(jobs, job{k, t.x.services[k], t.x.slicesOf(k)})
	}
	clear(t.dirty)
	t.mu.Unlock()

	// Each group builds from its own objects alone: a first Snapshot of a
	// big cluster builds them on every CPU, then applies them in turn.
	groups := make([]built, len(jobs))
	Parallel(len(jobs), func(i int) { groups[i] = buildGroup(jobs[i].k, jobs[i].svc, jobs[i].esl) })
	d := &Delta{From: t.version, Changed: map[ServicePortName]Prior{}}
	for i, j := range jobs {
		t.apply(j.k, groups[i], d.Changed)
	}
	if len(d.Changed) > 0 || t.version == 0 {
		t.version = versions.Add(1)
	}
	d.To = t.version
	t.state.Delta = d
	return t.state, t.allErrors()
}

// apply replaces key k's ports in the state by b's, recording what
// changed with what it was.
func (t *Tracker) apply(k key, b built, changed map[ServicePortName]Prior) {
	st := t.state
	if len(b.errs) > 0 {
		t.errs[k] = b.errs
	} else {
		delete(t.errs, k)
	}
	was := func(name ServicePortName) {
		if _, seen := changed[name]; !seen {
			changed[name] = Prior{Port: st.Ports[name], Endpoints: st.Endpoints[name]}
		}
	}
	now := make([]ServicePortName, 0, len(b.ports))
	for _, sp := range b.ports {
		now = append(now, sp.Name)
		eps := b.endpoints[sp.Name]
		// Equal objects stay: consumers find them unchanged by identity.
		if old, ok := st.Ports[sp.Name]; ok && old.Equal(sp) {
			if EqualEndpoints(st.Endpoints[sp.Name], eps) {
				continue
			}
			sp = old
		}
		was(sp.Name)
		st.Ports[sp.Name] = sp
		st.Endpoints[sp.Name] = eps
	}
	for _, name := range t.ports[k] {
		if !slices.Contains(now, name) {
			was(name)
			delete(st.Ports, name)
			delete(st.Endpoints, name)
		}
	}
	if len(now) > 0 {
		t.ports[k] = now
	} else {
		delete(t.ports, k)
	}
}

// allErrors concatenates the current errors in Build's order.
func (t *Tracker) allErrors() []ObjectError {
	var out []ObjectError
	for _, k := range slices.SortedFunc(maps.Keys(t.errs), compareKeys) {
		out = append(out, t.errs[k]...)
	}
	return out
}

func firstNonNil[T any](a, b *T) *T {
	if a != nil {
		return a
	}
	return b
}
