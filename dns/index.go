package dns

// Design note: the index.
//
// Every owner (a Service with its EndpointSlices and subdomain pods, a Pod,
// the zone itself) contributes Records. The index keeps, per name, the
// contributions of each owner and a Node merged from them; an event
// recomputes only the owner it touches and rebuilds only the names that
// owner had or now has. A Node is immutable once published (its packed
// answer cache is filled at most once per type, from the Node's own
// records), so a reader that got one under the read lock may use it after
// releasing the lock. Empty non-terminals (names that only have names
// below them, such as <ns>.svc.<zone>) are counted per name so that they
// answer NODATA rather than NXDOMAIN.
//
// Readers take a sync.RWMutex read lock for one map lookup; writers hold the
// write lock while they recompute one owner (microseconds), so queries are
// never served from a partly applied event.

import (
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	mdns "github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Node is every record of one name. It is never modified after publication
// except for its packed-answer cache.
type Node struct {
	Name  string
	RRs   []mdns.RR // sorted by type
	CNAME *mdns.CNAME
	// packed holds, per answer slot, the packed reply for this name with a
	// zero ID and the lower-case question (see fast.go).
	packed [numSlots]atomic.Pointer[packedReply]
}

// Get returns the records of type t.
func (n *Node) Get(t uint16) []mdns.RR {
	var out []mdns.RR
	for _, rr := range n.RRs {
		if rr.Header().Rrtype == t {
			out = append(out, rr)
		}
	}
	return out
}

// contribution is one owner's records at one name. Most names have one.
type contribution struct {
	owner string
	rrs   []mdns.RR
}

// Index is the record index. Its methods are safe for concurrent use.
type Index struct {
	cfg  Config
	soa  *mdns.SOA
	mu   sync.RWMutex
	node map[string]*Node
	ent  map[string]int // names below each name (within the zone)

	contrib map[string][]contribution // name -> what each owner puts there
	owned   map[string][]string       // owner -> names

	services  map[string]*corev1.Service
	slices    map[string]map[string]*discoveryv1.EndpointSlice // service key -> slice name
	pods      map[string]*corev1.Pod
	subdomain map[string]map[string]*corev1.Pod // ns/subdomain -> pod key

	synced atomic.Bool
	// OnError, if set, receives problems with objects (called under the
	// write lock: it must not call back into the index).
	OnError func(error)
}

// NewIndex returns an index holding only the zone's own records.
func NewIndex(cfg Config) *Index {
	cfg.Zone = strings.ToLower(mdns.Fqdn(cfg.Zone))
	x := &Index{
		cfg: cfg, soa: SOA(cfg),
		node: map[string]*Node{}, ent: map[string]int{},
		contrib: map[string][]contribution{}, owned: map[string][]string{},
		services: map[string]*corev1.Service{}, slices: map[string]map[string]*discoveryv1.EndpointSlice{},
		pods: map[string]*corev1.Pod{}, subdomain: map[string]map[string]*corev1.Pod{},
	}
	x.setOwner("zone", ZoneRecords(cfg))
	return x
}

// Config returns the configuration the index was built with (zone as FQDN).
func (x *Index) Config() Config { return x.cfg }

// SOA returns the zone's SOA record.
func (x *Index) SOA() *mdns.SOA { return x.soa }

// Synced reports whether the first full sync has been applied.
func (x *Index) Synced() bool { return x.synced.Load() }

// SetSynced marks the first full sync as applied.
func (x *Index) SetSynced() { x.synced.Store(true) }

// InZone reports whether the lower-case FQDN name is the zone or below it.
func (x *Index) InZone(name string) bool {
	z := x.cfg.Zone
	return name == z || len(name) > len(z) && strings.HasSuffix(name, z) && name[len(name)-len(z)-1] == '.'
}

// Lookup returns the node of a lower-case FQDN, or nil; exists is true when
// the name has records or names below it.
func (x *Index) Lookup(name string) (n *Node, exists bool) {
	x.mu.RLock()
	n = x.node[name]
	exists = n != nil || x.ent[name] > 0
	x.mu.RUnlock()
	return n, exists
}

// Len returns the number of names with records.
func (x *Index) Len() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.node)
}

func svcKey(ns, name string) string { return ns + "/" + name }

// OnService applies a Service add (old nil), update or delete (new nil).
func (x *Index) OnService(old, new *corev1.Service) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if new == nil {
		k := svcKey(old.Namespace, old.Name)
		delete(x.services, k)
		x.setOwner("svc/"+k, nil)
		return
	}
	k := svcKey(new.Namespace, new.Name)
	x.services[k] = new
	x.refreshService(k)
}

// OnEndpointSlice applies an EndpointSlice change.
func (x *Index) OnEndpointSlice(old, new *discoveryv1.EndpointSlice) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if old != nil {
		if k, ok := sliceService(old); ok {
			delete(x.slices[k], old.Name)
			if len(x.slices[k]) == 0 {
				delete(x.slices, k)
			}
			if new == nil {
				x.refreshService(k)
			}
		}
	}
	if new != nil {
		if k, ok := sliceService(new); ok {
			if x.slices[k] == nil {
				x.slices[k] = map[string]*discoveryv1.EndpointSlice{}
			}
			x.slices[k][new.Name] = new
			x.refreshService(k)
		}
		if old != nil {
			if k, ok := sliceService(old); ok {
				if k2, _ := sliceService(new); k2 != k {
					x.refreshService(k)
				}
			}
		}
	}
}

func sliceService(s *discoveryv1.EndpointSlice) (string, bool) {
	name := s.Labels[discoveryv1.LabelServiceName]
	return svcKey(s.Namespace, name), name != ""
}

// OnPod applies a Pod change (pod records and hostname/subdomain names).
func (x *Index) OnPod(old, new *corev1.Pod) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, p := range []*corev1.Pod{old, new} {
		if p != nil && p.Spec.Subdomain != "" {
			sk := svcKey(p.Namespace, p.Spec.Subdomain)
			delete(x.subdomain[sk], svcKey(p.Namespace, p.Name))
			if len(x.subdomain[sk]) == 0 {
				delete(x.subdomain, sk)
			}
		}
	}
	if new == nil {
		k := svcKey(old.Namespace, old.Name)
		delete(x.pods, k)
		x.setOwner("pod/"+k, nil)
	} else {
		k := svcKey(new.Namespace, new.Name)
		x.pods[k] = new
		x.setOwner("pod/"+k, PodRecords(x.cfg, new))
		if new.Spec.Subdomain != "" {
			sk := svcKey(new.Namespace, new.Spec.Subdomain)
			if x.subdomain[sk] == nil {
				x.subdomain[sk] = map[string]*corev1.Pod{}
			}
			x.subdomain[sk][k] = new
		}
	}
	done := map[string]bool{}
	for _, p := range []*corev1.Pod{old, new} {
		if p != nil && p.Spec.Subdomain != "" {
			sk := svcKey(p.Namespace, p.Spec.Subdomain)
			if !done[sk] {
				done[sk] = true
				x.refreshService(sk)
			}
		}
	}
}

// OnSynced marks the index ready (kube.ServiceHandler).
func (x *Index) OnSynced() { x.SetSynced() }

// refreshService recomputes one Service's records. Caller holds mu.
func (x *Index) refreshService(k string) {
	svc := x.services[k]
	if svc == nil {
		x.setOwner("svc/"+k, nil)
		return
	}
	slices := make([]*discoveryv1.EndpointSlice, 0, len(x.slices[k]))
	for _, s := range x.slices[k] {
		slices = append(slices, s)
	}
	sort.Slice(slices, func(i, j int) bool { return slices[i].Name < slices[j].Name })
	pods := make([]*corev1.Pod, 0, len(x.subdomain[k]))
	for _, p := range x.subdomain[k] {
		pods = append(pods, p)
	}
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	r, errs := ServiceRecords(x.cfg, svc, slices, pods)
	if x.OnError != nil {
		for _, err := range errs {
			x.OnError(err)
		}
	}
	x.setOwner("svc/"+k, r)
}

// setOwner replaces everything owner contributes. Caller holds mu (or is
// the constructor).
func (x *Index) setOwner(owner string, r Records) {
	touched := map[string]bool{}
	for _, name := range x.owned[owner] {
		touched[name] = true
		x.contrib[name] = slices.DeleteFunc(x.contrib[name], func(c contribution) bool { return c.owner == owner })
	}
	names := make([]string, 0, len(r))
	for name, rrs := range r {
		touched[name] = true
		x.contrib[name] = append(x.contrib[name], contribution{owner: owner, rrs: rrs})
		names = append(names, name)
	}
	if len(names) == 0 {
		delete(x.owned, owner)
	} else {
		x.owned[owner] = names
	}
	for name := range touched {
		x.rebuild(name)
	}
}

// rebuild merges a name's contributions into a fresh Node.
func (x *Index) rebuild(name string) {
	c := x.contrib[name]
	_, had := x.node[name]
	if len(c) == 0 {
		delete(x.contrib, name)
		if had {
			delete(x.node, name)
			x.countParents(name, -1)
		}
		return
	}
	n := &Node{Name: name}
	if len(c) == 1 { // the common case: one owner, its records as they are
		n.RRs = c[0].rrs
	} else {
		sort.Slice(c, func(i, j int) bool { return c[i].owner < c[j].owner })
		seen := map[string]bool{}
		for _, o := range c {
			for _, rr := range o.rrs {
				s := rr.String()
				if !seen[s] {
					seen[s] = true
					n.RRs = append(n.RRs, rr)
				}
			}
		}
	}
	sort.SliceStable(n.RRs, func(i, j int) bool { return n.RRs[i].Header().Rrtype < n.RRs[j].Header().Rrtype })
	for _, rr := range n.RRs {
		if cn, ok := rr.(*mdns.CNAME); ok {
			n.CNAME = cn
			break
		}
	}
	x.node[name] = n
	if !had {
		x.countParents(name, 1)
	}
}

// countParents adjusts the empty non-terminal counts of name's ancestors
// inside the zone.
func (x *Index) countParents(name string, d int) {
	if !x.InZone(name) {
		return
	}
	for p := parent(name); p != "" && x.InZone(p); p = parent(p) {
		x.ent[p] += d
		if x.ent[p] <= 0 {
			delete(x.ent, p)
		}
		if p == x.cfg.Zone {
			break
		}
	}
}

// parent strips the first label of an FQDN ("" for the root).
func parent(name string) string {
	i := strings.IndexByte(name, '.')
	if i < 0 || i == len(name)-1 {
		return ""
	}
	return name[i+1:]
}
