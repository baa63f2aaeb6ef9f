package iptables

import (
	"fmt"
	"net/netip"
	"slices"
)

// Dispatch is a two-level tree instead of kube-proxy's one long chain: the
// services chain jumps on the destination's bucket (a /24 for IPv4, a /120
// for IPv6) to a bucket chain that matches the exact VIP and port. A packet
// is compared with the buckets and then with one bucket's entries, not with
// every service; and a change to one service rewrites its bucket chain, not
// a chain of every service. NodePorts are bucketed the same way by port.
const (
	bucketBits4    = 24
	bucketBits6    = 120
	nodePortBucket = 128 // ports per NodePort bucket chain
)

func (r *renderer) addVIP(ip netip.Addr, rule string) {
	bits := bucketBits4
	if ip.Is6() {
		bits = bucketBits6
	}
	b := netip.PrefixFrom(ip, bits).Masked()
	r.vips[b] = append(r.vips[b], rule)
}

func bucketPort(p uint16) uint16 { return p / nodePortBucket * nodePortBucket }

// dispatch renders the services chain, the bucket chains, the NodePort
// chains and the filter chain of ports without endpoints.
func (r *renderer) dispatch() {
	buckets := make([]netip.Prefix, 0, len(r.vips))
	for b := range r.vips {
		buckets = append(buckets, b)
	}
	slices.SortFunc(buckets, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	for _, b := range buckets {
		name := hashName("WEFT-VIPS-", b.String())
		r.add(TableNAT, chainServices, "-d %s -j %s", b, name)
		c := r.chain(TableNAT, name)
		c.Rules = append(c.Rules, r.vips[b]...)
	}
	for _, ip := range r.cfg.NodePortIPs {
		if familyOf(ip) == r.family {
			r.add(TableNAT, chainServices, `-d %s -m comment --comment "node ports" -j %s`, hostLen(ip), chainNodePorts)
		}
	}
	starts := make([]uint16, 0, len(r.nports))
	for s := range r.nports {
		starts = append(starts, s)
	}
	slices.Sort(starts)
	for _, s := range starts {
		name := hashName("WEFT-NP-", fmt.Sprint(s))
		r.add(TableNAT, chainNodePorts, "-p tcp -m tcp --dport %d:%d -j %s", s, s+nodePortBucket-1, name)
		r.add(TableNAT, chainNodePorts, "-p udp -m udp --dport %d:%d -j %s", s, s+nodePortBucket-1, name)
		r.add(TableNAT, chainNodePorts, "-p sctp -m sctp --dport %d:%d -j %s", s, s+nodePortBucket-1, name)
		c := r.chain(TableNAT, name)
		c.Rules = append(c.Rules, r.nports[s]...)
	}
	drop := r.cfg.dropMark()
	r.add(TableFilter, chainFilterSvc, `-m mark --mark %#x/%#x -m comment --comment "source not allowed by loadBalancerSourceRanges" -j DROP`, drop, drop)
	c := r.chain(TableFilter, chainFilterSvc)
	c.Rules = append(c.Rules, r.rejects...)
}
