package model

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Build computes the desired proxy state from Services and EndpointSlices,
// with an ObjectError for everything it had to leave out (see doc.go). It
// is pure, and the result does not depend on the order of its inputs (but
// of two objects with the same namespace/name, the later wins). Errors come
// in the order of the Service key they belong to, a Service's before its
// slices'.
func Build(services []*corev1.Service, endpointSlices []*discoveryv1.EndpointSlice) (State, []ObjectError) {
	x := newIndex()
	for _, svc := range services {
		if svc != nil {
			x.setService(keyOf(svc.Namespace, svc.Name), svc)
		}
	}
	for _, es := range endpointSlices {
		if es != nil {
			x.setSlice(keyOf(es.Namespace, es.Name), es)
		}
	}
	st := State{Ports: map[ServicePortName]*ServicePort{}, Endpoints: map[ServicePortName][]Endpoint{}}
	var errs []ObjectError
	for _, k := range x.keys() {
		b := buildGroup(k, x.services[k], x.slicesOf(k))
		b.into(st)
		errs = append(errs, b.errs...)
	}
	return st, errs
}

// key names a Service, or the Service an EndpointSlice is labelled with
// (Name "" for an unlabelled slice: no Service has that name).
type key struct{ Namespace, Name string }

func keyOf(ns, name string) key { return key{ns, name} }

func (k key) String() string { return k.Namespace + "/" + k.Name }

func compareKeys(a, b key) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}

// index keeps the latest objects, the slices filed under the Service they
// are labelled with: a Service key and everything filed under it build
// together, independently of every other key.
type index struct {
	services map[key]*corev1.Service
	slices   map[key]map[string]*discoveryv1.EndpointSlice // by Service key, then slice name
	filed    map[key]key                                   // slice key -> the Service key it is filed under
}

func newIndex() *index {
	return &index{
		services: map[key]*corev1.Service{},
		slices:   map[key]map[string]*discoveryv1.EndpointSlice{},
		filed:    map[key]key{},
	}
}

// setService stores (or, for nil, forgets) the Service with key k.
func (x *index) setService(k key, svc *corev1.Service) {
	if svc == nil {
		delete(x.services, k)
		return
	}
	x.services[k] = svc
}

// setSlice stores (or, for nil, forgets) the slice with key k and returns
// the Service keys whose groups changed: the one it was filed under before
// and the one it is filed under now.
func (x *index) setSlice(k key, es *discoveryv1.EndpointSlice) []key {
	var touched []key
	if from, ok := x.filed[k]; ok {
		delete(x.slices[from], k.Name)
		if len(x.slices[from]) == 0 {
			delete(x.slices, from)
		}
		delete(x.filed, k)
		touched = append(touched, from)
	}
	// A slice labelled away from weft is as if it were not there.
	if es == nil || notProxied(es.Labels) {
		return touched
	}
	to := keyOf(k.Namespace, sliceService(es))
	if x.slices[to] == nil {
		x.slices[to] = map[string]*discoveryv1.EndpointSlice{}
	}
	x.slices[to][k.Name] = es
	x.filed[k] = to
	if len(touched) == 0 || touched[0] != to {
		touched = append(touched, to)
	}
	return touched
}

// slicesOf lists the slices filed under k, by name.
func (x *index) slicesOf(k key) []*discoveryv1.EndpointSlice {
	m := x.slices[k]
	out := make([]*discoveryv1.EndpointSlice, 0, len(m))
	for _, name := range slices.Sorted(maps.Keys(m)) {
		out = append(out, m[name])
	}
	return out
}

// keys lists every Service key with a Service or a slice, sorted.
func (x *index) keys() []key {
	ks := slices.Collect(maps.Keys(x.services))
	for k := range x.slices {
		if _, ok := x.services[k]; !ok {
			ks = append(ks, k)
		}
	}
	slices.SortFunc(ks, compareKeys)
	return ks
}

// built is what one Service key builds to.
type built struct {
	ports     []*ServicePort
	endpoints map[ServicePortName][]Endpoint
	errs      []ObjectError
}

func (b built) into(st State) {
	for _, sp := range b.ports {
		st.Ports[sp.Name] = sp
		st.Endpoints[sp.Name] = b.endpoints[sp.Name]
	}
}

// buildGroup builds one Service (nil if there is none) with the slices
// labelled with its name, sorted by name (which decides between equally
// good duplicates).
func buildGroup(k key, svc *corev1.Service, esl []*discoveryv1.EndpointSlice) built {
	if svc == nil {
		return built{errs: orphans(k, esl)}
	}
	ports, errs := servicePorts(svc)
	b := built{ports: ports, endpoints: make(map[ServicePortName][]Endpoint, len(ports)), errs: errs}
	if len(ports) == 0 {
		return b // not proxied: its slices are none of our business
	}
	n := 0
	for _, es := range esl {
		n += len(es.Endpoints)
	}
	lists := make(map[ServicePortName]*endpointList, len(ports))
	for _, sp := range ports {
		l := make(endpointList, 0, n)
		lists[sp.Name] = &l
	}
	served := func(v6 bool) bool {
		return slices.ContainsFunc(ports[0].ClusterIPs, func(c netip.Addr) bool { return c.Is6() == v6 })
	}
	for _, es := range esl {
		r := &reporter{kind: "EndpointSlice", key: es.Namespace + "/" + es.Name}
		if v6, ok := sliceFamily(es, r); ok && served(v6) {
			eps := sliceEndpoints(es, v6, r)
			for _, p := range slicePorts(es, k.Namespace, k.Name, r) {
				l, ok := lists[p.name]
				if !ok {
					continue
				}
				for _, e := range eps {
					e.Port = p.port
					*l = append(*l, e)
				}
			}
		}
		b.errs = append(b.errs, r.errs...)
	}
	for name, l := range lists {
		b.endpoints[name] = l.sorted()
	}
	return b
}

// orphans reports slices filed under a key with no Service.
func orphans(k key, esl []*discoveryv1.EndpointSlice) []ObjectError {
	const field = "metadata.labels[" + discoveryv1.LabelServiceName + "]"
	var errs []ObjectError
	for _, es := range esl {
		err := fmt.Errorf("no Service %s: %w", k, ErrNoService)
		if k.Name == "" {
			err = fmt.Errorf("no %s label: %w", discoveryv1.LabelServiceName, ErrNoService)
		}
		errs = append(errs, objErr("EndpointSlice", es.Namespace+"/"+es.Name, field, err))
	}
	return errs
}
