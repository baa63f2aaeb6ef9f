package routing

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
)

// Compute returns the routes, neighbours, FDB entries and VXLAN device the
// node cfg.Self needs to reach the pods of nodes. It is pure.
//
// A node that cannot be routed, or one family of it, is left out and
// reported as a NodeError naming the node and the field; the other nodes are
// unaffected. Nodes are taken in name order, so when two podCIDRs (or VTEP
// MACs, or addresses) collide the node whose name sorts later is the one
// left out, whatever the order of nodes. Self (by name) is skipped.
//
// If cfg itself is unusable, Compute returns a zero Desired, which Apply
// refuses, and NodeErrors naming cfg.Self.Name.
func Compute(cfg Config, nodes []Node) (Desired, []NodeError) {
	c, errs := newComputer(cfg)
	if len(errs) > 0 {
		return Desired{}, errs
	}
	sorted := slices.Clone(nodes)
	slices.SortStableFunc(sorted, func(a, b Node) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(fmt.Sprint(a), fmt.Sprint(b)))
	})
	seen := map[string]bool{}
	for _, n := range sorted {
		switch {
		case n.Name == "":
			c.fail(n, "Name", fmt.Errorf("node without a name: %w", ErrMissing))
		case n.Name == cfg.Self.Name:
		case seen[n.Name]:
			c.fail(n, "Name", fmt.Errorf("listed more than once: %w", ErrDuplicate))
		default:
			seen[n.Name] = true
			c.add(n)
		}
	}
	d := c.d
	slices.SortFunc(d.Routes, func(a, b Route) int { return comparePrefix(a.Dst, b.Dst) })
	slices.SortFunc(d.Neighbors, func(a, b Neighbor) int { return a.IP.Compare(b.IP) })
	slices.SortFunc(d.FDB, func(a, b FDBEntry) int {
		return cmp.Or(cmp.Compare(a.MAC.String(), b.MAC.String()), a.Dst.Compare(b.Dst))
	})
	return d, c.errs
}

func comparePrefix(a, b netip.Prefix) int {
	return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
}

// computer accumulates the desired state node by node, remembering who
// already claimed which podCIDR, node address and VTEP MAC.
type computer struct {
	mode     Mode
	dev      VXLANDevice
	ipip     IPIPDevice
	ipipCfg  IPIPConfig
	underlay int // address family of the VXLAN underlay
	d        Desired
	errs     []NodeError
	cidrs    []claim[netip.Prefix]
	ips      map[netip.Addr]string
	macs     map[string]string
}

type claim[T any] struct {
	owner string
	v     T
}

func newComputer(cfg Config) (*computer, []NodeError) {
	self := cfg.Self
	c := &computer{mode: cfg.Mode, ips: map[netip.Addr]string{}, macs: map[string]string{}}
	if self.Name == "" {
		c.errs = append(c.errs, NodeError{"", "Name", fmt.Errorf("the node's own name: %w", ErrMissing)})
	}
	if cfg.Mode != ModeHostGW && cfg.Mode != ModeVXLAN && cfg.Mode != ModeIPIP {
		c.fail(self, "Mode", fmt.Errorf("mode %q (want %q, %q or %q): %w", cfg.Mode, ModeHostGW, ModeVXLAN, ModeIPIP, ErrInvalid))
	}
	ips, ipErrs := addrsByFamily(self.InternalIPs)
	for _, err := range ipErrs {
		c.fail(self, "InternalIPs", err)
	}
	cidrs, cidrErrs := prefixesByFamily(self.PodCIDRs)
	for _, err := range cidrErrs {
		c.fail(self, "PodCIDRs", err)
	}
	if cfg.Mode == ModeVXLAN {
		dev, errs := vxlanSettings(cfg)
		c.errs = append(c.errs, errs...)
		for _, f := range []int{4, 6} {
			if p, ok := cidrs[f]; ok {
				dev.Addrs = append(dev.Addrs, netip.PrefixFrom(p.Addr(), p.Addr().BitLen()))
			}
		}
		c.dev, c.underlay = dev, family(dev.Local)
		c.d.Device = &c.dev
		c.macs[dev.MAC.String()] = self.Name
	}
	if cfg.Mode == ModeIPIP {
		dev, errs := ipipSettings(cfg)
		c.errs = append(c.errs, errs...)
		if p, ok := cidrs[4]; ok {
			dev.Addrs = []netip.Prefix{netip.PrefixFrom(p.Addr(), 32)}
		}
		c.ipip, c.ipipCfg = dev, cfg.IPIP
		c.d.IPIP = &c.ipip
	}
	if len(c.errs) > 0 {
		return nil, c.errs
	}
	c.d.Mode = cfg.Mode
	for _, p := range cidrs {
		c.cidrs = append(c.cidrs, claim[netip.Prefix]{self.Name, p})
	}
	for _, a := range ips {
		c.ips[a] = self.Name
	}
	return c, nil
}

func (c *computer) fail(n Node, field string, err error) {
	c.errs = append(c.errs, NodeError{Node: n.Name, Field: field, Err: err})
}

// add adds what it takes to reach node n, or reports why it cannot.
func (c *computer) add(n Node) {
	ips, ipErrs := addrsByFamily(n.InternalIPs)
	for _, err := range ipErrs {
		c.fail(n, "InternalIPs", err)
	}
	cidrs, cidrErrs := prefixesByFamily(n.PodCIDRs)
	for _, err := range cidrErrs {
		c.fail(n, "PodCIDRs", err)
	}
	if len(n.PodCIDRs) == 0 {
		c.fail(n, "PodCIDRs", fmt.Errorf("no podCIDR: %w", ErrMissing))
		return
	}
	if c.mode == ModeVXLAN {
		c.addVXLAN(n, ips, cidrs)
		return
	}
	for _, f := range []int{4, 6} {
		p, ok := cidrs[f]
		if !ok {
			continue
		}
		gw, ok := ips[f]
		if !ok {
			c.fail(n, "InternalIPs", fmt.Errorf("no usable %s address to route podCIDR %s via: %w", familyName(f), p, ErrMissing))
			continue
		}
		if !c.ipFree(n, gw) || !c.claimCIDR(n, p) {
			continue
		}
		c.ips[gw] = n.Name
		r := Route{Dst: p, Via: gw}
		if c.mode == ModeIPIP && f == 4 && !(c.ipipCfg.CrossSubnet && c.ipipCfg.Subnet.Contains(gw)) {
			r.Dev, r.OnLink = c.ipip.Name, true
		}
		c.d.Routes = append(c.d.Routes, r)
	}
}

func (c *computer) addVXLAN(n Node, ips map[int]netip.Addr, cidrs map[int]netip.Prefix) {
	remote, ok := ips[c.underlay]
	if !ok {
		c.fail(n, "InternalIPs", fmt.Errorf("no usable %s address for the VXLAN underlay: %w", familyName(c.underlay), ErrMissing))
		return
	}
	if err := checkMAC(n.VTEPMAC); err != nil {
		c.fail(n, "VTEPMAC", err)
		return
	}
	if owner, ok := c.macs[n.VTEPMAC.String()]; ok {
		c.fail(n, "VTEPMAC", fmt.Errorf("%s is already node %q's: %w", n.VTEPMAC, owner, ErrDuplicate))
		return
	}
	if !c.ipFree(n, remote) {
		return
	}
	routed := false
	for _, f := range []int{4, 6} {
		p, ok := cidrs[f]
		if !ok || !c.claimCIDR(n, p) {
			continue
		}
		routed = true
		c.d.Routes = append(c.d.Routes, Route{Dst: p, Via: p.Addr(), Dev: c.dev.Name, OnLink: true})
		c.d.Neighbors = append(c.d.Neighbors, Neighbor{IP: p.Addr(), MAC: n.VTEPMAC})
	}
	if routed {
		c.macs[n.VTEPMAC.String()] = n.Name
		c.ips[remote] = n.Name
		c.d.FDB = append(c.d.FDB, FDBEntry{MAC: n.VTEPMAC, Dst: remote})
	}
}

// ipFree reports whether a is n's to use: no other node claimed it first.
func (c *computer) ipFree(n Node, a netip.Addr) bool {
	if owner, ok := c.ips[a]; ok && owner != n.Name {
		c.fail(n, "InternalIPs", fmt.Errorf("%s is already node %q's: %w", a, owner, ErrDuplicate))
		return false
	}
	return true
}

// claimCIDR records that p is n's, unless it overlaps an earlier claim.
func (c *computer) claimCIDR(n Node, p netip.Prefix) bool {
	for _, cl := range c.cidrs {
		if cl.v.Overlaps(p) {
			c.fail(n, "PodCIDRs", fmt.Errorf("%s overlaps node %q's podCIDR %s: %w", p, cl.owner, cl.v, ErrOverlap))
			return false
		}
	}
	c.cidrs = append(c.cidrs, claim[netip.Prefix]{n.Name, p})
	return true
}
