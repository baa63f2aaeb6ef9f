package iptables

import (
	"cmp"
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

func vipBucket(ip netip.Addr) netip.Prefix {
	bits := bucketBits4
	if ip.Is6() {
		bits = bucketBits6
	}
	return netip.PrefixFrom(ip, bits).Masked()
}

func bucketPort(p uint16) uint16 { return p / nodePortBucket * nodePortBucket }

func byName(a, b *portOut) int { return cmp.Compare(a.name, b.name) }

// dispatch rebuilds the bucket chains u touched and, when buckets came or
// went, the services chain and the NodePort chain; and the filter chain of
// ports without endpoints. Bucket chains keep their names (the bucket's),
// so a change inside a bucket rewrites that chain alone, however many
// buckets there are.
func (r *Renderer) dispatch(u *update) {
	newBuckets := false
	for b := range u.vips {
		members := sortedMembers(r.vipMembers[b])
		_, had := r.vipChains[b]
		newBuckets = newBuckets || had != (len(members) > 0)
		if len(members) == 0 {
			delete(r.vipChains, b)
			continue
		}
		var rules []string
		for _, o := range members {
			rules = append(rules, o.vips[b]...)
		}
		r.vipChains[b] = &Chain{Table: TableNAT, Name: hashName("WEFT-VIPS-", b.String()), Rules: rules, Fixed: true}
	}
	newPorts := false
	for s := range u.nports {
		members := sortedMembers(r.npMembers[s])
		_, had := r.npChains[s]
		newPorts = newPorts || had != (len(members) > 0)
		if len(members) == 0 {
			delete(r.npChains, s)
			continue
		}
		var rules []string
		for _, o := range members {
			rules = append(rules, o.nports[s]...)
		}
		r.npChains[s] = &Chain{Table: TableNAT, Name: hashName("WEFT-NP-", fmt.Sprint(s)), Rules: rules, Fixed: true}
	}
	if r.services == nil || newBuckets {
		var rules []string
		for _, b := range sortedKeysFunc(r.vipChains, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) }) {
			rules = append(rules, fmt.Sprintf("-d %s -j %s", b, r.vipChains[b].Name))
		}
		for _, ip := range r.cfg.NodePortIPs {
			if familyOf(ip) == r.family {
				rules = append(rules, fmt.Sprintf(`-d %s -m comment --comment "node ports" -j %s`, hostLen(ip), chainNodePorts))
			}
		}
		r.services = &Chain{Table: TableNAT, Name: chainServices, Rules: rules, Fixed: true}
	}
	if r.nodePorts == nil || newPorts {
		var rules []string
		for _, s := range sortedKeysFunc(r.npChains, cmp.Compare[uint16]) {
			for _, p := range []string{"tcp", "udp", "sctp"} {
				rules = append(rules, fmt.Sprintf("-p %s -m %s --dport %d:%d -j %s", p, p, s, s+nodePortBucket-1, r.npChains[s].Name))
			}
		}
		r.nodePorts = &Chain{Table: TableNAT, Name: chainNodePorts, Rules: rules, Fixed: true}
	}
	if r.filterSvc == nil || u.rejects {
		drop := r.cfg.dropMark()
		rules := []string{fmt.Sprintf(`-m mark --mark %#x/%#x -m comment --comment "source not allowed by loadBalancerSourceRanges" -j DROP`, drop, drop)}
		for _, o := range sortedMembers(r.rejecting) {
			rules = append(rules, o.rejects...)
		}
		r.filterSvc = &Chain{Table: TableFilter, Name: chainFilterSvc, Rules: rules, Fixed: true}
	}
}

func sortedMembers(m map[*portOut]bool) []*portOut {
	out := make([]*portOut, 0, len(m))
	for o := range m {
		out = append(out, o)
	}
	slices.SortFunc(out, byName)
	return out
}

// addressed returns a content-addressed chain: its name hashes the prefix,
// the identity and the rules.
func addressed(table, prefix string, rules []string, identity ...string) *Chain {
	return &Chain{Table: table, Name: hashName(prefix, append(identity, rules...)...), Rules: rules}
}
