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
	newBuckets := rebuildBuckets(u.vips, r.vipMembers, r.vipChains,
		func(o *portOut, b netip.Prefix) []string { return o.vips[b] },
		func(b netip.Prefix) string { return hashName("WEFT-VIPS-", b.String()) })
	newPorts := rebuildBuckets(u.nports, r.npMembers, r.npChains,
		func(o *portOut, s uint16) []string { return o.nports[s] },
		func(s uint16) string { return hashName("WEFT-NP-", fmt.Sprint(s)) })
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

// rebuildBuckets rebuilds the chains of the touched buckets from their
// member ports' rules (deleting emptied buckets) and reports whether a
// bucket appeared or vanished.
func rebuildBuckets[K comparable](touched map[K]bool, members map[K]map[*portOut]bool, chains map[K]*Chain,
	rulesOf func(*portOut, K) []string, name func(K) string) bool {
	changed := false
	for k := range touched {
		ports := sortedMembers(members[k])
		_, had := chains[k]
		changed = changed || had != (len(ports) > 0)
		if len(ports) == 0 {
			delete(chains, k)
			continue
		}
		var rules []string
		for _, o := range ports {
			rules = append(rules, rulesOf(o, k)...)
		}
		chains[k] = &Chain{Table: TableNAT, Name: name(k), Rules: rules, Fixed: true}
	}
	return changed
}

func sortedMembers(m map[*portOut]bool) []*portOut {
	out := make([]*portOut, 0, len(m))
	for o := range m {
		out = append(out, o)
	}
	slices.SortFunc(out, byName)
	return out
}
