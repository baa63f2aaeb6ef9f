package model

import "slices"

// Select picks the endpoints node (in zone) uses for sp, with kube-proxy's
// CategorizeEndpoints semantics (see doc.go):
//
//   - usable endpoints are the Ready ones or, when none is Ready, those
//     Serving and Terminating (so that connections drain gracefully);
//   - the cluster-wide list follows topology hints: node hints when every
//     Ready endpoint has one and one names node, else zone hints when every
//     Ready endpoint has one and one names zone, else none;
//   - Local are the usable endpoints on node, with their own fallback to
//     Serving and Terminating ones, and without topology;
//   - Internal is Local with internalTrafficPolicy Local, else the cluster
//     list; External is Local with externalTrafficPolicy Local (for a port
//     with external entry points), else the cluster list.
//
// Lists keep the order of eps and may share its array (read-only, as eps
// is). Select is pure; sp must not be nil.
func Select(sp *ServicePort, eps []Endpoint, node, zone string) Selected {
	var s Selected
	for _, e := range eps {
		if Usable(e) {
			s.HasAny = true
			break
		}
	}
	if !s.HasAny {
		return s
	}
	hinted := topology(eps, node, zone)
	cluster := filter(eps, func(e Endpoint) bool { return e.Ready && hinted(e) })
	if len(cluster) == 0 {
		cluster = filter(eps, servingTerminating)
	}
	local := func(e Endpoint) bool { return node != "" && e.NodeName == node }
	s.Local = filter(eps, func(e Endpoint) bool { return e.Ready && local(e) })
	if len(s.Local) == 0 {
		s.Local = filter(eps, func(e Endpoint) bool { return servingTerminating(e) && local(e) })
	}
	s.Internal, s.External = cluster, cluster
	if sp.InternalPolicyLocal {
		s.Internal = s.Local
	}
	if sp.ExternalPolicyLocal && sp.HasExternal() {
		s.External = s.Local
	}
	return s
}

// Usable reports whether traffic may go to e: it is Ready, or Serving
// while Terminating (the fallback when no endpoint is Ready).
func Usable(e Endpoint) bool { return e.Ready || servingTerminating(e) }

func servingTerminating(e Endpoint) bool { return e.Serving && e.Terminating }

// topology returns the filter topology hints impose on Ready endpoints:
// kube-proxy's choice between PreferSameNode, PreferSameZone and none.
// Hints count only when every Ready endpoint carries one of the kind (a
// partial set means the EndpointSlice controller is mid-update or gave up)
// and at least one is for this node, or zone; otherwise traffic would go
// nowhere, so hints are ignored.
func topology(eps []Endpoint, node, zone string) func(Endpoint) bool {
	all := func(hints func(Endpoint) []string, want string) bool {
		if want == "" {
			return false
		}
		found := false
		for _, e := range eps {
			if !e.Ready {
				continue
			}
			h := hints(e)
			if len(h) == 0 {
				return false
			}
			found = found || contains(h, want)
		}
		return found
	}
	switch {
	case all(Endpoint.ForNodes, node):
		return func(e Endpoint) bool { return contains(e.ForNodes(), node) }
	case all(Endpoint.ForZones, zone):
		return func(e Endpoint) bool { return contains(e.ForZones(), zone) }
	}
	return func(Endpoint) bool { return true }
}

func contains(list []string, s string) bool { return slices.Contains(list, s) }

// filter returns the endpoints keep accepts, in order; nil if none, and
// eps itself (capacity cut, lists being read-only) if all: the common
// case, which then allocates nothing.
func filter(eps []Endpoint, keep func(Endpoint) bool) []Endpoint {
	n := 0
	for i := range eps {
		if keep(eps[i]) {
			n++
		}
	}
	switch n {
	case 0:
		return nil
	case len(eps):
		return eps[:n:n]
	}
	out := make([]Endpoint, 0, n)
	for _, e := range eps {
		if keep(e) {
			out = append(out, e)
		}
	}
	return out
}
