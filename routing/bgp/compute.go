package bgp

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"

	"k8s.io/apimachinery/pkg/labels"
)

// Node is what BGP needs to know about one Kubernetes node.
type Node struct {
	Name        string
	Labels      map[string]string
	InternalIPs []netip.Addr   // at most one per family is used
	PodCIDRs    []netip.Prefix // at most one per family
}

// Service is what BGP announces of one Service.
type Service struct {
	Key         string // namespace/name, for errors
	ExternalIPs []netip.Addr
	LBIPs       []netip.Addr
	// LocalOnly: externalTrafficPolicy Local; then the addresses are
	// announced only while LocalReady (a ready endpoint on this node).
	LocalOnly  bool
	LocalReady bool
}

// Input is the state a node's BGP plan is computed from.
type Input struct {
	Self     string // this node's name
	Nodes    []Node // every node of the cluster, Self included
	Settings Settings
	// Passwords of external peers, by PeerSettings.Index, resolved by the
	// caller from their Secret or file. A peer that names a password
	// missing here is skipped.
	Passwords map[int]string
	// ClusterCIDRs are the cluster's pod CIDRs: never accepted from
	// outside the nodes.
	ClusterCIDRs []netip.Prefix
	Services     []Service
}

// Neighbor is one BGP session the node keeps.
type Neighbor struct {
	Name        string // a node's name or the external peer's
	Address     netip.Addr
	ASN         uint32
	Port        uint16 // 0: 179
	Local       netip.Addr
	Password    string
	HoldTime    uint32
	Keepalive   uint32
	MultihopTTL uint8
	External    bool // not a node of the cluster
	RRClient    bool // this node reflects routes to it
	// Passive: wait for the peer to connect. Between two nodes only the
	// one with the lower address dials, so they never open two
	// connections at once (a collision costs a session reset).
	Passive    bool
	IPv4, IPv6 bool
}

// Announcement is one prefix the node announces.
type Announcement struct {
	Prefix      netip.Prefix
	NextHop     netip.Addr
	Kind        Kind
	Communities []uint32 // sorted
}

// Plan is everything one node's speaker should do.
type Plan struct {
	ASN           uint32
	RouterID      netip.Addr
	Reflector     bool
	ClusterID     netip.Addr // set when Reflector
	RestartTime   uint32
	Neighbors     []Neighbor     // by Address
	Announcements []Announcement // by Prefix
	Import        ImportPolicy
}

// Compute turns a node's Input into its Plan. Whatever it had to leave
// out (a node without an address, a peer without its password, an
// address of a family the node cannot reach) is returned as errors naming
// the object and the field; the rest is planned. It fails as a whole only
// when Self is not among the nodes.
func Compute(in Input) (Plan, []error) {
	var self *Node
	for i := range in.Nodes {
		if in.Nodes[i].Name == in.Self {
			self = &in.Nodes[i]
		}
	}
	if self == nil {
		return Plan{}, []error{fmt.Errorf("node %q: not among the nodes", in.Self)}
	}
	s := in.Settings
	p := Plan{ASN: s.ASN, RouterID: routerID(*self), RestartTime: s.RestartTime}
	var errs []error
	isRR := func(n *Node) bool { return s.Reflectors != nil && s.Reflectors.Matches(labels.Set(n.Labels)) }
	p.Reflector = isRR(self)
	if p.Reflector {
		p.ClusterID = s.ClusterID
		if !p.ClusterID.IsValid() {
			p.ClusterID = p.RouterID
		}
	}
	p.Import = ImportPolicy{NodeRoutes: map[netip.Prefix]netip.Addr{}, Prefixes: s.ImportPrefixes}
	p.Import.Refused = append(append(p.Import.Refused, in.ClusterCIDRs...), s.ServiceCIDRs...)
	for i := range in.Nodes {
		n := &in.Nodes[i]
		if n == self {
			continue
		}
		for _, c := range n.PodCIDRs {
			if nh, ok := familyAddr(n.InternalIPs, c.Addr().Is4()); ok {
				p.Import.NodeRoutes[c.Masked()] = nh
			}
		}
		if s.Reflectors != nil && !p.Reflector && !isRR(n) {
			continue // a client peers only with the reflectors
		}
		addr, ok := sessionAddr(n.InternalIPs)
		if !ok {
			errs = append(errs, fmt.Errorf("node %q: InternalIPs: no address to peer with: %w", n.Name, ErrInvalid))
			continue
		}
		local, ok := familyAddr(self.InternalIPs, addr.Is4())
		if !ok {
			errs = append(errs, fmt.Errorf("node %q: InternalIPs: no %s address to peer with node %q", self.Name, family(addr), n.Name))
			continue
		}
		p.Neighbors = append(p.Neighbors, Neighbor{Name: n.Name, Address: addr, ASN: s.ASN, Local: local,
			RRClient: p.Reflector && !isRR(n), IPv4: true, IPv6: true, Passive: local.Compare(addr) > 0})
	}
	for _, ps := range s.Peers {
		if !ps.Nodes.Matches(labels.Set(self.Labels)) {
			continue
		}
		nb := Neighbor{Name: ps.Name, Address: ps.Address, ASN: ps.ASN, Port: ps.Port, HoldTime: ps.HoldTime, Keepalive: ps.Keepalive,
			MultihopTTL: ps.MultihopTTL, External: true, IPv4: ps.IPv4, IPv6: ps.IPv6}
		if ps.PasswordSecret != nil || ps.PasswordFile != "" {
			pw, ok := in.Passwords[ps.Index]
			if !ok {
				field := "passwordSecret"
				if ps.PasswordFile != "" {
					field = "passwordFile"
				}
				errs = append(errs, FieldError{fmt.Sprintf("peers[%d].%s", ps.Index, field), fmt.Errorf("peer %q skipped: its password is not available", ps.Name)})
				continue
			}
			nb.Password = pw
		}
		nb.Local, _ = familyAddr(self.InternalIPs, ps.Address.Is4())
		if i := slices.IndexFunc(p.Neighbors, func(o Neighbor) bool { return o.Address == nb.Address }); i >= 0 {
			errs = append(errs, FieldError{fmt.Sprintf("peers[%d].address", ps.Index), fmt.Errorf("peer %q skipped: %s is node %q", ps.Name, ps.Address, p.Neighbors[i].Name)})
			continue
		}
		p.Neighbors = append(p.Neighbors, nb)
	}
	slices.SortFunc(p.Neighbors, func(a, b Neighbor) int { return a.Address.Compare(b.Address) })
	a := announcer{byPrefix: map[netip.Prefix]*Announcement{}, self: self, comms: s.Communities}
	for _, c := range self.PodCIDRs {
		errs = append(errs, a.add(c.Masked(), KindPodCIDR, "PodCIDRs"))
	}
	for _, c := range s.ServiceCIDRs {
		errs = append(errs, a.add(c, KindServiceCIDR, "announce.serviceCIDRs"))
	}
	for _, svc := range in.Services {
		if svc.LocalOnly && !svc.LocalReady {
			continue
		}
		if s.ExternalIPs {
			for _, ip := range svc.ExternalIPs {
				errs = append(errs, wrapService(svc.Key, "spec.externalIPs", a.add(netip.PrefixFrom(ip, ip.BitLen()), KindExternalIP, "")))
			}
		}
		if s.LBIPs {
			for _, ip := range svc.LBIPs {
				errs = append(errs, wrapService(svc.Key, "status.loadBalancer.ingress", a.add(netip.PrefixFrom(ip, ip.BitLen()), KindLoadBalancerIP, "")))
			}
		}
	}
	for _, an := range a.byPrefix {
		slices.Sort(an.Communities)
		an.Communities = slices.Compact(an.Communities)
		p.Announcements = append(p.Announcements, *an)
	}
	slices.SortFunc(p.Announcements, func(x, y Announcement) int { return comparePrefix(x.Prefix, y.Prefix) })
	return p, slices.DeleteFunc(errs, func(e error) bool { return e == nil })
}

type announcer struct {
	byPrefix map[netip.Prefix]*Announcement
	self     *Node
	comms    map[Kind][]uint32
}

// add announces prefix with the node's address of its family as next hop.
func (a announcer) add(prefix netip.Prefix, kind Kind, field string) error {
	nh, ok := familyAddr(a.self.InternalIPs, prefix.Addr().Is4())
	if !ok {
		err := fmt.Errorf("%s %s not announced: node %q has no %s InternalIP for a next hop", kind, prefix, a.self.Name, family(prefix.Addr()))
		if field != "" {
			err = fmt.Errorf("%s: %w", field, err)
		}
		return err
	}
	an := a.byPrefix[prefix]
	if an == nil {
		// The first kind names it; a prefix announced for two reasons
		// carries both kinds' communities.
		an = &Announcement{Prefix: prefix, NextHop: nh, Kind: kind}
		a.byPrefix[prefix] = an
	}
	an.Communities = append(an.Communities, a.comms[kind]...)
	return nil
}

func wrapService(key, field string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("service %s: %s: %w", key, field, err)
}

// sessionAddr is the address a node is peered on: its IPv4 InternalIP if it
// has one (both families travel over it), else its IPv6 one.
func sessionAddr(ips []netip.Addr) (netip.Addr, bool) {
	if a, ok := familyAddr(ips, true); ok {
		return a, true
	}
	return familyAddr(ips, false)
}

func familyAddr(ips []netip.Addr, v4 bool) (netip.Addr, bool) {
	for _, ip := range ips {
		ip = ip.Unmap()
		if ip.IsValid() && ip.Is4() == v4 {
			return ip, true
		}
	}
	return netip.Addr{}, false
}

func family(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

// routerID is the node's IPv4 InternalIP, or for an IPv6-only node an
// address derived from its name (a BGP identifier is 32 bits, and only
// needs to be unique among the peers).
func routerID(n Node) netip.Addr {
	if a, ok := familyAddr(n.InternalIPs, true); ok {
		return a
	}
	h := fnv.New32a()
	h.Write([]byte(n.Name))
	v := h.Sum32()
	return netip.AddrFrom4([4]byte{byte(v>>24) | 1, byte(v >> 16), byte(v >> 8), byte(v)})
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return cmp.Compare(a.Bits(), b.Bits())
}
