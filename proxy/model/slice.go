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
		if h := e.Hints; h != nil {
			for _, z := range h.ForZones {
				ep.ZoneHints = append(ep.ZoneHints, z.Name)
			}
			for _, n := range h.ForNodes {
				ep.NodeHints = append(ep.NodeHints, n.Name)
			}
		}
		out = append(out, ep)
	}
	return out
}

// slicePorts maps each of the slice's ports to the service port it serves,
// by name and protocol (a nil name is "", a nil protocol TCP). A port with
// no number (nil: "all ports", which kube-proxy does not proxy either) is
// ignored; a number out of range is reported.
func slicePorts(es *discoveryv1.EndpointSlice, ns, svc string, r *reporter) map[ServicePortName]uint16 {
	out := map[ServicePortName]uint16{}
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
		if _, dup := out[name]; !dup {
			out[name] = uint16(*p.Port)
		}
	}
	return out
}

// endpointSet collects one service port's endpoints, one per IP:port.
type endpointSet map[netip.AddrPort]Endpoint

// add keeps e unless an endpoint with the same IP:port ranks at least as
// high: Ready first, then Serving, then not Terminating. (An IP reused by a
// new pod while the old one terminates thus goes to the new pod.)
func (s endpointSet) add(e Endpoint) {
	k := netip.AddrPortFrom(e.IP, e.Port)
	if old, ok := s[k]; !ok || rank(e) > rank(old) {
		s[k] = e
	}
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

// sorted lists the set by IP, then port; never nil.
func (s endpointSet) sorted() []Endpoint {
	out := make([]Endpoint, 0, len(s))
	for _, e := range s {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b Endpoint) int {
		if c := a.IP.Compare(b.IP); c != 0 {
			return c
		}
		return int(a.Port) - int(b.Port)
	})
	return out
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
