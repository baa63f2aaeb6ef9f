package userspace

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/weftnet/weft/proxy/model"
)

// MapEntry is one service port's listener in the service map.
type MapEntry struct {
	Service     string `json:"service"` // namespace/name
	Port        string `json:"port"`    // the port's name ("" for a single unnamed port)
	Protocol    string `json:"protocol"`
	ServicePort uint16 `json:"servicePort"`
	Scope       Scope  `json:"scope"`
	// Address is where the listener listens (what to dial in rootless
	// mode); empty when it could not be bound.
	Address string `json:"address,omitempty"`
	// Frontends are what the glue redirects to it (redirect mode).
	Frontends []string `json:"frontends,omitempty"`
	// Endpoints are the endpoints new clients get now.
	Endpoints []string `json:"endpoints"`
	// Error says why the service port has no listener.
	Error string `json:"error,omitempty"`
}

// Services is the service map: every planned listener, bound or not,
// ordered by Service, port and scope.
func (b *Backend) Services() []MapEntry {
	b.mu.Lock()
	type item struct {
		spec *Listener
		addr string
		err  error
	}
	var items []item
	for _, l := range b.listeners {
		items = append(items, item{spec: l.spec.Load(), addr: l.address()})
	}
	for _, f := range b.failed {
		items = append(items, item{spec: &f.spec, err: f.err})
	}
	b.mu.Unlock()
	slices.SortFunc(items, func(a, b item) int { return compareKeys(a.spec.Key, b.spec.Key) })
	out := make([]MapEntry, 0, len(items))
	for _, it := range items {
		s := it.spec
		e := MapEntry{Service: svcName(s.Key), Port: s.Key.Port.Port, Protocol: string(s.Protocol), ServicePort: s.ServicePort,
			Scope: s.Key.Scope, Address: it.addr, Endpoints: []string{}}
		if it.err != nil {
			e.Error = it.err.Error()
		}
		for _, f := range s.Frontends {
			e.Frontends = append(e.Frontends, f.String())
		}
		for i, fam := range s.ByFamily {
			if s.Family != 0 && s.Family != 4+2*i {
				continue
			}
			for _, ep := range fam.Serve {
				e.Endpoints = append(e.Endpoints, ep.String())
			}
		}
		out = append(out, e)
	}
	return out
}

// ServicesHandler serves the service map as JSON (weft-proxy's /services).
// ?service=namespace/name narrows it to one Service.
func (b *Backend) ServicesHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entries := b.Services()
		if want := r.URL.Query().Get("service"); want != "" {
			entries = slices.DeleteFunc(entries, func(e MapEntry) bool { return e.Service != want })
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(entries)
	})
}

// Dump returns what a first sync of st would set up, touching nothing
// (weft-proxy --dry-run): the listeners, each on its first candidate port
// (a real start takes the next when that one is held), and the glue in
// redirect mode.
func (b *Backend) Dump(st model.State) (string, error) {
	plan := Plan(b.planConfig(), st)
	bound := map[Key]uint16{}
	var out strings.Builder
	out.WriteString("# listeners: service port, scope, address -> endpoints (IPv4; IPv6)\n")
	for _, l := range plan {
		if l.Protocol == model.SCTP {
			fmt.Fprintf(&out, "%s %s: not proxied (%v)\n", l.Key.Port, l.Key.Scope, errSCTP)
			continue
		}
		port := Candidates(l.Key, l.ServicePort, b.Rootless(), b.cfg.PortRange)[0]
		bound[l.Key] = port
		fmt.Fprintf(&out, "%s %s %s -> %v; %v\n", l.Key.Port, l.Key.Scope, net.JoinHostPort(b.addrs[0].String(), strconv.Itoa(int(port))),
			l.ByFamily[0].Serve, l.ByFamily[1].Serve)
	}
	switch g := b.glue.(type) {
	case *nftGlue:
		fake := knftables.NewFake(knftables.InetFamily, TableName)
		tx := fake.NewTransaction()
		RenderNFT(tx, Glue(plan, bound), g.clusterCIDRs)
		if err := fake.Run(context.Background(), tx); err != nil {
			return "", err
		}
		out.WriteString("# nftables glue\n" + fake.Dump())
	case *iptablesGlue:
		for _, fam := range g.families {
			fmt.Fprintf(&out, "# iptables glue, IPv%d\n%s", fam, RenderIPTables(Glue(plan, bound), fam, g.clusterCIDRs, iptablesJumps))
		}
	}
	return out.String(), nil
}
