package userspace

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/weftnet/weft/proxy/model"
)

// GlueSpec is what the kernel glue of redirect mode does with each
// frontend, before a renderer turns it into iptables rules or nftables
// elements. Every list is sorted.
type GlueSpec struct {
	// Redirect sends a frontend to the local port of its listener.
	Redirect []Redirect
	// Reject refuses a frontend at once: no endpoint anywhere, or its
	// listener could not be bound.
	Reject []Frontend
	// Drop drops a frontend: it has endpoints, but none this node may use
	// (internalTrafficPolicy Local without a local endpoint,
	// externalTrafficPolicy Local without any endpoint at all for pods).
	Drop []Frontend
	// DropExternal drops a frontend for clients outside the cluster and
	// the node (externalTrafficPolicy Local without a local endpoint);
	// pods and the node are redirected and get the cluster-wide list.
	DropExternal []Frontend
	// Firewall are the LoadBalancer frontends with sourceRanges: other
	// sources are dropped.
	Firewall []Frontend
	// Guard are the listeners' ports: a new connection to one that the
	// glue did not redirect is dropped, so that nobody reaches a listener
	// past the rules above.
	Guard []Guard
}

// Redirect is one frontend sent to a listener's port.
type Redirect struct {
	Frontend
	To uint16
}

// Guard is one listener's protocol and port.
type Guard struct {
	Protocol model.Protocol
	Port     uint16
}

// Glue computes the glue for the listeners and the ports bound for them
// (bound[key] 0 or missing: not bound). It is pure.
func Glue(ls []Listener, bound map[Key]uint16) GlueSpec {
	var g GlueSpec
	guards := map[Guard]bool{}
	for _, l := range ls {
		port := bound[l.Key]
		if port != 0 {
			guards[Guard{l.Protocol, port}] = true
		}
		for _, fr := range l.Frontends {
			e := l.ByFamily[familyIndex(fr.Addr)]
			if len(fr.SourceRanges) > 0 {
				g.Firewall = append(g.Firewall, fr)
			}
			switch {
			case port == 0 || !e.HasAny:
				g.Reject = append(g.Reject, fr)
			case len(e.Serve) > 0:
				g.Redirect = append(g.Redirect, Redirect{fr, port})
			case len(e.Cluster) > 0:
				g.Redirect = append(g.Redirect, Redirect{fr, port})
				g.DropExternal = append(g.DropExternal, fr)
			default:
				g.Drop = append(g.Drop, fr)
			}
		}
	}
	for k := range guards {
		g.Guard = append(g.Guard, k)
	}
	slices.SortFunc(g.Guard, func(a, b Guard) int { return cmp.Or(cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Port, b.Port)) })
	byFrontend := func(a, b Frontend) int {
		return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Port, b.Port))
	}
	slices.SortFunc(g.Redirect, func(a, b Redirect) int { return byFrontend(a.Frontend, b.Frontend) })
	for _, l := range []*[]Frontend{&g.Reject, &g.Drop, &g.DropExternal, &g.Firewall} {
		slices.SortFunc(*l, byFrontend)
	}
	return g
}

// Equal reports whether g and o glue the same.
func (g GlueSpec) Equal(o GlueSpec) bool {
	fe := func(a, b Frontend) bool {
		return a.Addr == b.Addr && a.Protocol == b.Protocol && a.Port == b.Port && slices.Equal(a.SourceRanges, b.SourceRanges)
	}
	return slices.EqualFunc(g.Redirect, o.Redirect, func(a, b Redirect) bool { return a.To == b.To && fe(a.Frontend, b.Frontend) }) &&
		slices.EqualFunc(g.Reject, o.Reject, fe) && slices.EqualFunc(g.Drop, o.Drop, fe) &&
		slices.EqualFunc(g.DropExternal, o.DropExternal, fe) && slices.EqualFunc(g.Firewall, o.Firewall, fe) &&
		slices.Equal(g.Guard, o.Guard)
}

// family is the frontends of l of one family (4 or 6).
func family[T interface{ addr() netip.Addr }](l []T, fam int) []T {
	var out []T
	for _, x := range l {
		if (fam == 6) == x.addr().Is6() {
			out = append(out, x)
		}
	}
	return out
}

func (f Frontend) addr() netip.Addr { return f.Addr }
