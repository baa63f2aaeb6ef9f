package ipvs

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/weftnet/weft/proxy/model"
)

// Config is the IPVS backend's configuration.
type Config struct {
	NodeName, Zone string
	// NodePortIPs are the node addresses NodePorts answer on: one virtual
	// server per address and NodePort.
	NodePortIPs []netip.Addr
	// ClusterCIDRs are the pod ranges: traffic to a ClusterIP from any
	// other source is masqueraded (so that replies come back through the
	// node). Without them every ClusterIP connection is masqueraded.
	ClusterCIDRs  []netip.Prefix
	MasqueradeAll bool
	MasqueradeBit int
	// Scheduler is the IPVS scheduler of every virtual server ("" is rr).
	Scheduler string
	// Families are the IP families the node uses (4, 6).
	Families []int
}

// Schedulers are the IPVS schedulers the backend accepts (the kernel's
// ip_vs_<name> modules).
var Schedulers = []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "mh", "fo", "ovf", "twos"}

// DefaultScheduler is round robin, as in kube-proxy.
const DefaultScheduler = "rr"

// VSKey identifies a virtual server: address, protocol and port.
type VSKey struct {
	Addr  netip.Addr
	Proto model.Protocol
	Port  uint16
}

func (k VSKey) String() string {
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(k.Addr, k.Port), k.Proto)
}

// Dest is a real server of a virtual server.
type Dest struct {
	Addr netip.Addr
	Port uint16
}

func (d Dest) String() string { return netip.AddrPortFrom(d.Addr, d.Port).String() }

// VirtualServer is one IPVS virtual server and its real servers.
type VirtualServer struct {
	VSKey
	Scheduler string
	// Timeout is the persistence timeout in seconds (ClientIP affinity);
	// 0 is no persistence.
	Timeout uint32
	Dests   []Dest // sorted
	// Service names the service port it belongs to (for errors).
	Service model.ServicePortName
}

// equalService reports whether a and b differ only in their real servers.
func (v *VirtualServer) equalService(o *VirtualServer) bool {
	return v.Scheduler == o.Scheduler && v.Timeout == o.Timeout
}

// Entry is a VIP, protocol and port in one of the glue sets.
type Entry = VSKey

// Desired is the whole IPVS data plane of a model.State.
type Desired struct {
	Servers map[VSKey]*VirtualServer
	// Addrs are the addresses held on the dummy device: ClusterIPs,
	// externalIPs and LoadBalancer IPs of every service port (also those
	// without a virtual server, so that their traffic reaches the node's
	// input path and the glue rules), sorted.
	Addrs []netip.Addr
	// ClusterIPs are the ClusterIP entries: masqueraded unless the source
	// is a pod (in ClusterCIDRs).
	ClusterIPs []Entry
	// MasqExternal are the external entries (NodePort, externalIP, LB IP)
	// of ports with externalTrafficPolicy Cluster: always masqueraded.
	MasqExternal []Entry
	// Drop are entries with endpoints somewhere but none usable by this
	// node (a Local traffic policy): their traffic is dropped. Entries
	// without any endpoint keep a virtual server without real servers,
	// which IPVS rejects (ICMP port unreachable: connection refused).
	Drop []Entry
	// Firewall are LoadBalancer IP entries with sourceRanges; Allow are
	// the ranges each accepts.
	Firewall []Entry
	Allow    []Allowed
	// Hairpin are the local real servers: a connection from one to
	// itself through a virtual server is masqueraded.
	Hairpin []netip.Addr
}

// Allowed is a source range of a firewalled LoadBalancer entry.
type Allowed struct {
	Entry
	Source netip.Prefix
}

// Render computes the desired IPVS state of st for the node in cfg. It is
// pure.
func Render(cfg Config, st model.State) *Desired {
	d := &Desired{Servers: map[VSKey]*VirtualServer{}}
	sched := cmp.Or(cfg.Scheduler, DefaultScheduler)
	families := map[bool]bool{} // is6 -> served
	for _, f := range cfg.Families {
		families[f == 6] = true
	}
	if len(cfg.Families) == 0 {
		families[false] = true
	}
	addrs := map[netip.Addr]bool{}
	hairpin := map[netip.Addr]bool{}
	for name, sp := range st.Ports {
		sel := model.Select(sp, st.Endpoints[name], cfg.NodeName, cfg.Zone)
		for _, e := range sel.Local {
			hairpin[e.IP] = true
		}
		var timeout uint32
		if sp.AffinitySeconds > 0 {
			timeout = uint32(sp.AffinitySeconds)
		}
		// add makes the virtual server of one entry point with the
		// endpoints of its family.
		add := func(vip netip.Addr, port uint16, eps []model.Endpoint) bool {
			k := VSKey{Addr: vip, Proto: sp.Protocol, Port: port}
			var dests []Dest
			for _, e := range eps {
				if e.IP.Is6() == vip.Is6() {
					dests = append(dests, Dest{Addr: e.IP, Port: e.Port})
				}
			}
			// Endpoints only of the other family are none for this one
			// (rejected, as by a single-family proxy), not a Local policy.
			if len(dests) == 0 && sel.HasAny && slices.ContainsFunc(st.Endpoints[name], func(e model.Endpoint) bool { return e.IP.Is6() == vip.Is6() }) {
				d.Drop = append(d.Drop, k)
				return false
			}
			slices.SortFunc(dests, func(a, b Dest) int {
				return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port))
			})
			d.Servers[k] = &VirtualServer{VSKey: k, Scheduler: sched, Timeout: timeout, Dests: dests, Service: name}
			return true
		}
		for _, ip := range sp.ClusterIPs {
			if !families[ip.Is6()] {
				continue
			}
			addrs[ip] = true
			if add(ip, sp.Port, sel.Internal) {
				d.ClusterIPs = append(d.ClusterIPs, VSKey{Addr: ip, Proto: sp.Protocol, Port: sp.Port})
			}
		}
		external := func(ip netip.Addr, port uint16) {
			if !families[ip.Is6()] || !add(ip, port, sel.External) {
				return
			}
			if k := (VSKey{Addr: ip, Proto: sp.Protocol, Port: port}); !sp.ExternalPolicyLocal {
				d.MasqExternal = append(d.MasqExternal, k)
			}
		}
		if sp.NodePort != 0 {
			// A NodePort answers on the node addresses of the Service's
			// families only.
			for _, ip := range cfg.NodePortIPs {
				if slices.ContainsFunc(sp.ClusterIPs, func(c netip.Addr) bool { return c.Is6() == ip.Is6() }) {
					external(ip, sp.NodePort)
				}
			}
		}
		for _, ip := range sp.ExternalIPs {
			addrs[ip] = true
			external(ip, sp.Port)
		}
		for _, ip := range sp.LoadBalancerIPs {
			addrs[ip] = true
			external(ip, sp.Port)
			if len(sp.SourceRanges) > 0 && families[ip.Is6()] {
				k := VSKey{Addr: ip, Proto: sp.Protocol, Port: sp.Port}
				d.Firewall = append(d.Firewall, k)
				for _, r := range sp.SourceRanges {
					if r.Addr().Is6() == ip.Is6() {
						d.Allow = append(d.Allow, Allowed{Entry: k, Source: r})
					}
				}
			}
		}
	}
	for a := range addrs {
		d.Addrs = append(d.Addrs, a)
	}
	for a := range hairpin {
		d.Hairpin = append(d.Hairpin, a)
	}
	slices.SortFunc(d.Addrs, netip.Addr.Compare)
	slices.SortFunc(d.Hairpin, netip.Addr.Compare)
	for _, s := range []*[]Entry{&d.ClusterIPs, &d.MasqExternal, &d.Drop, &d.Firewall} {
		slices.SortFunc(*s, compareKeys)
		*s = slices.Compact(*s)
	}
	slices.SortFunc(d.Allow, func(a, b Allowed) int {
		return cmp.Or(compareKeys(a.Entry, b.Entry), a.Source.Addr().Compare(b.Source.Addr()), cmp.Compare(a.Source.Bits(), b.Source.Bits()))
	})
	d.Allow = slices.Compact(d.Allow)
	return d
}

func compareKeys(a, b VSKey) int {
	return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Proto, b.Proto), cmp.Compare(a.Port, b.Port))
}
