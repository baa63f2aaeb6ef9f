package model

import (
	"fmt"
	"net/netip"
	"slices"

	discoveryv1 "k8s.io/api/discovery/v1"
)

// sliceFamily is the family an EndpointSlice's addresses belong to: ok is
// false for FQDN slices (not proxied) and unknown address types (reported).
func sliceFamily(es *discoveryv1.EndpointSlice, r *reporter) (v6, ok bool) {
	switch es.AddressType {
	case discoveryv1.AddressTypeIPv4:
		return false, true
	case discoveryv1.AddressTypeIPv6:
		return true, true
	case discoveryv1.AddressTypeFQDN:
		return false, false
	}
	r.add("addressType", fmt.Errorf("%q is not IPv4, IPv6 or FQDN: %w", es.AddressType, ErrInvalid))
	return false, false
}

// sliceEndpoints parses a slice's endpoints (ports not yet set). An
// endpoint's address is its first valid one: the API defines no meaning
// for more, and kube-proxy reads only the first; every bad address is
// reported, and an endpoint with none valid is left out.
func sliceEndpoints(es *discoveryv1.EndpointSlice, v6 bool, r *reporter) []Endpoint {
	out := make([]Endpoint, 0, len(es.Endpoints))
	for i := range es.Endpoints {
		e := &es.Endpoints[i]
		if len(e.Addresses) == 0 {
			r.add(fmt.Sprintf("endpoints[%d].addresses", i), fmt.Errorf("no address: %w", ErrInvalid))
			continue
		}
		var ip netip.Addr
		for j, s := range e.Addresses {
			a, err := parseIP(s)
			if err == nil && a.Is6() != v6 {
				err = fmt.Errorf("%s is not an %s address: %w", a, es.AddressType, ErrInvalid)
			}
			if err != nil {
				r.add(fmt.Sprintf("endpoints[%d].addresses[%d]", i, j), err)
				continue
			}
			if !ip.IsValid() {
				ip = a
			}
		}
		if !ip.IsValid() {
			continue
		}
		c := e.Conditions
		ep := Endpoint{
			IP:          ip,
			Ready:       c.Ready == nil || *c.Ready,
			Terminating: c.Terminating != nil && *c.Terminating,
			NodeName:    deref(e.NodeName),
			Zone:        deref(e.Zone),
		}
		ep.Serving = ep.Ready
		if c.Serving != nil {
			ep.Serving = *c.Serving
		}
		if h := e.Hints; h != nil && len(h.ForZones)+len(h.ForNodes) > 0 {
			ep.Hints = &Hints{}
			for _, z := range h.ForZones {
				ep.Hints.Zones = append(ep.Hints.Zones, z.Name)
			}
			for _, n := range h.ForNodes {
				ep.Hints.Nodes = append(ep.Hints.Nodes, n.Name)
			}
		}
		out = append(out, ep)
	}
	return out
}

// slicePort is a slice port's number for the service port it serves.
type slicePort struct {
	name ServicePortName
	port uint16
}

// slicePorts maps each of the slice's ports to the service port it serves,
// by name and protocol (a nil name is "", a nil protocol TCP). A port with
// no number (nil: "all ports", which kube-proxy does not proxy either) is
// ignored; a number out of range is reported.
func slicePorts(es *discoveryv1.EndpointSlice, ns, svc string, r *reporter) []slicePort {
	out := make([]slicePort, 0, len(es.Ports))
	for i, p := range es.Ports {
		if p.Port == nil {
			continue
		}
		if !validPort(*p.Port) {
			r.add(fmt.Sprintf("ports[%d].port", i), fmt.Errorf("%d is not a port number (1-65535): %w", *p.Port, ErrInvalid))
			continue
		}
		proto := TCP
		if p.Protocol != nil && *p.Protocol != "" {
			proto = Protocol(*p.Protocol)
		}
		name := ServicePortName{Namespace: ns, Name: svc, Port: deref(p.Name), Protocol: proto}
		if !slices.ContainsFunc(out, func(q slicePort) bool { return q.name == name }) {
			out = append(out, slicePort{name, uint16(*p.Port)})
		}
	}
	return out
}

// endpointList collects one service port's endpoints, in the order of the
// slices (by name) and of their endpoints.
type endpointList []Endpoint

// sorted returns the list by IP, then port, with each IP:port once: the
// best of its duplicates, Ready first, then Serving, then not Terminating
// (an IP reused by a new pod while the old one terminates thus goes to the
// new pod), the first collected among equals. Never nil.
func (l endpointList) sorted() []Endpoint {
	slices.SortStableFunc(l, func(a, b Endpoint) int {
		if c := a.IP.Compare(b.IP); c != 0 {
			return c
		}
		if a.Port != b.Port {
			return int(a.Port) - int(b.Port)
		}
		return rank(b) - rank(a)
	})
	out := slices.CompactFunc(l, func(a, b Endpoint) bool { return a.IP == b.IP && a.Port == b.Port })
	if 2*len(out) < cap(out) { // do not keep a mostly unused array alive
		return append(make([]Endpoint, 0, len(out)), out...)
	}
	return slices.Clip(out)
}

func rank(e Endpoint) int {
	r := 0
	if e.Ready {
		r += 4
	}
	if e.Serving {
		r += 2
	}
	if !e.Terminating {
		r++
	}
	return r
}

// sliceService is the Service an EndpointSlice belongs to, by its
// kubernetes.io/service-name label; "" when unlabelled.
func sliceService(es *discoveryv1.EndpointSlice) string {
	return es.Labels[discoveryv1.LabelServiceName]
}

func deref[T ~string](p *T) T {
	if p == nil {
		return ""
	}
	return *p
}
