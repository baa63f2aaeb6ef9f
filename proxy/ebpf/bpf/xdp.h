// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// weft_nodeport_xdp: the external frontends' translation at the XDP hook
// of the uplinks (--bpf-xdp), ahead of weft_nodeport on their tc ingress,
// which stays attached. Included by nodeport.c: one object, so both run
// on the same maps (flow.h's steps over them), and a flow started on one
// hook goes on on the other.
//
// What it does with a TCP or UDP packet of a client of an external
// frontend (IPv4 without options, or IPv6 without extension headers):
//   - a source outside loadBalancerSourceRanges, a frontend with
//     endpoints none of which is usable here (eTP Local): XDP_DROP;
//   - a frontend without endpoints: XDP_PASS untouched (the stack
//     answers with a reset or ICMP port unreachable);
//   - otherwise the destination becomes the backend (flow.h's choose,
//     record and current, as on tc) and the packet goes to the stack
//     (XDP_PASS): the kernel routes it, conntrack and netfilter see it as
//     they see the tc path's (FORWARD, where NetworkPolicy applies; no
//     redirect into a pod's device, which would skip it). A flow to
//     masquerade (eTP Cluster) needs skb->mark, which XDP has not: the
//     program puts XDP_META_MASQ in the packet's metadata
//     (bpf_xdp_adjust_meta) and weft_nodeport, on the same device's tc
//     ingress, turns it into the masquerade bit. A translated flow not
//     masqueraded carries XDP_META_DONE, so that weft_nodeport passes it
//     at once. Where the metadata cannot be written (a driver without
//     support), a masqueraded flow is left to tc (below) and a flow
//     without masquerade is translated all the same: weft_nodeport finds
//     neither a frontend nor a flow of the backend's address and passes
//     it.
// Left untouched to weft_nodeport (XDP_PASS, counted as handed off):
// DSR (frontends with SVC_DSR, flows with CT_DSR: the option and the
// routing stay on tc), IPv4 packets with options (weft's DSR option is
// tc's receive side), fragments, other protocols, connections the
// kernel's conntrack translates (CT_KERNEL).
//
// weft_xdp_stats counts per action (XDP_STAT_*), per CPU.

#ifndef WEFT_XDP_H
#define WEFT_XDP_H

#include <linux/ip.h>
#include <linux/ipv6.h>

// The metadata word weft_nodeport_xdp leaves in front of a packet it
// translated.
#define XDP_META_DONE 0x77656600 // "wef\0": translated, nothing more to do
#define XDP_META_MASQ 0x77656601 // translated, to masquerade

#define XDP_STAT_TRANSLATED 0 // translated and passed to the stack
#define XDP_STAT_DROPPED 1    // dropped (ranges, eTP Local without endpoint here)
#define XDP_STAT_HANDOFF 2    // a frontend's or flow's packet left to tc untouched
#define XDP_STAT_MAX 3

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, XDP_STAT_MAX);
} weft_xdp_stats SEC(".maps");

static __always_inline void xdp_count(__u32 stat)
{
	__u64 *n = bpf_map_lookup_elem(&weft_xdp_stats, &stat);

	if (n)
		(*n)++;
}

// xdp_parse fills p for a TCP or UDP packet over Ethernet, IPv4 without
// options or IPv6 without extension headers, unfragmented; it returns 0
// for those, -1 for anything else.
static __always_inline int xdp_parse(struct xdp_md *ctx, struct pkt *p)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	__u8 nexthdr;
	void *l4;

	if ((void *)(eth + 1) > end)
		return -1;
	p->l3off = ETH_HLEN;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > end || ip->version != 4 || ip->ihl != 5 || (ip->frag_off & bpf_htons(0x3fff)))
			return -1;
		p->v6 = 0;
		p->t.saddr[0] = p->t.saddr[1] = p->t.daddr[0] = p->t.daddr[1] = 0;
		p->t.saddr[2] = p->t.daddr[2] = bpf_htonl(0xffff);
		p->t.saddr[3] = ip->saddr;
		p->t.daddr[3] = ip->daddr;
		nexthdr = ip->protocol;
		l4 = ip + 1;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		if ((void *)(ip6 + 1) > end || ip6->version != 6)
			return -1;
		p->v6 = 1;
		__builtin_memcpy(p->t.saddr, &ip6->saddr, 16);
		__builtin_memcpy(p->t.daddr, &ip6->daddr, 16);
		nexthdr = ip6->nexthdr;
		l4 = ip6 + 1;
	} else {
		return -1;
	}
	p->l4off = l4 - data;
	if (nexthdr == IPPROTO_TCP) {
		if (l4 + 20 > end)
			return -1;
		p->tcp_flags = *(__u8 *)(l4 + 13);
	} else if (nexthdr == IPPROTO_UDP) {
		if (l4 + 8 > end)
			return -1;
	} else {
		return -1;
	}
	p->t.proto = nexthdr;
	p->t.sport = *(__u16 *)l4;
	p->t.dport = *(__u16 *)(l4 + 2);
	return 0;
}

// csum_fold folds a 32-bit ones' complement sum to 16 bits.
static __always_inline __u16 csum_fold(__u64 s)
{
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)s;
}

// csum_replace4 and csum_replace2 update checksum check for a 32-bit
// (16-bit) word of the data changed from from to to (RFC 1624, eqn. 3;
// any byte order, as long as all are the packet's).
static __always_inline __u16 csum_replace4(__u16 check, __u32 from, __u32 to)
{
	__u64 s = (__u16)~check;

	s += (__u16)~(from >> 16) + (__u16)~(from & 0xffff);
	s += (to >> 16) + (to & 0xffff);
	return (__u16)~csum_fold(s);
}

static __always_inline __u16 csum_replace2(__u16 check, __u16 from, __u16 to)
{
	__u64 s = (__u16)~check;

	s += (__u16)~from;
	s += to;
	return (__u16)~csum_fold(s);
}

// xdp_set_dst makes addr:port the destination of p (the packet parsed by
// xdp_parse), updating the IPv4 header's and the TCP/UDP checksums (a
// UDP checksum of 0 over IPv4, none, stays 0). It returns -1 when the
// packet is not as parsed.
static __always_inline int xdp_set_dst(struct xdp_md *ctx, const struct pkt *p, const __u32 addr[4], __u16 port)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	int tcp = p->t.proto == IPPROTO_TCP;
	__u16 *csum, *dport;
	void *l4;

	if (!p->v6) {
		struct iphdr *ip = data + ETH_HLEN;
		if ((void *)(ip + 1) > end)
			return -1;
		l4 = ip + 1;
		csum = l4 + (tcp ? 16 : 6);
		dport = l4 + 2;
		if ((void *)(csum + 1) > end || (void *)(dport + 1) > end)
			return -1;
		__u32 from = ip->daddr;
		ip->check = csum_replace4(ip->check, from, addr[3]);
		ip->daddr = addr[3];
		if (tcp || *csum) {
			__u16 c = csum_replace2(csum_replace4(*csum, from, addr[3]), *dport, port);
			*csum = !tcp && !c ? 0xffff : c;
		}
		*dport = port;
		return 0;
	}
	struct ipv6hdr *ip6 = data + ETH_HLEN;
	if ((void *)(ip6 + 1) > end)
		return -1;
	l4 = ip6 + 1;
	csum = l4 + (tcp ? 16 : 6);
	dport = l4 + 2;
	if ((void *)(csum + 1) > end || (void *)(dport + 1) > end)
		return -1;
	__s64 s = bpf_csum_diff((__be32 *)&ip6->daddr, 16, (__be32 *)addr, 16, (__u16)~*csum);
	if (s < 0)
		return -1;
	__u16 c = csum_replace2((__u16)~csum_fold(s), *dport, port);
	*csum = !tcp && !c ? 0xffff : c;
	__builtin_memcpy(&ip6->daddr, addr, 16);
	*dport = port;
	return 0;
}

// xdp_meta puts word in front of the packet as metadata; it returns -1
// where the driver keeps no metadata.
static __always_inline int xdp_meta(struct xdp_md *ctx, __u32 word)
{
	if (bpf_xdp_adjust_meta(ctx, -(int)sizeof(__u32)))
		return -1;
	__u32 *meta = (void *)(long)ctx->data_meta;
	if ((void *)(meta + 1) > (void *)(long)ctx->data)
		return -1;
	*meta = word;
	return 0;
}

// xdp_action is the XDP verdict of a step's result, counted.
static __always_inline int xdp_action(int v)
{
	switch (v) {
	case V_DROP:
		xdp_count(XDP_STAT_DROPPED);
		return XDP_DROP;
	case V_HANDOFF:
		xdp_count(XDP_STAT_HANDOFF);
		return XDP_PASS;
	}
	return XDP_PASS;
}

SEC("xdp")
int weft_nodeport_xdp(struct xdp_md *ctx)
{
	struct pkt p = {};
	struct tuple ck, rk;
	struct ct_value ct = {};
	struct choice ch = {};
	int v, done = 0, meta;

	if (xdp_parse(ctx, &p))
		return XDP_PASS;
	ck = p.t;
	// DSR flows stay with tc; so do masqueraded ones where the mark
	// cannot go along as metadata (tried below, once the flow is known).
	v = current(&p, &ct, &rk, &done, 1 << CT_DSR);
	if (v == NOT_MINE) {
		v = choose(&p, &ct, SVC_DSR, &ch);
		if (v != BALANCED)
			return v == NOT_MINE ? XDP_PASS : xdp_action(v);
	} else if (v != FOUND) {
		return xdp_action(v);
	}
	meta = xdp_meta(ctx, ct.masq ? XDP_META_MASQ : XDP_META_DONE);
	if (meta && ct.masq)
		// Not recorded yet for a new flow: weft_nodeport balances it
		// alike (the same hash, the same affinity).
		return xdp_action(V_HANDOFF);
	if (v == BALANCED && record(&p, &ct) != BALANCED)
		return xdp_action(V_DROP);
	if (xdp_set_dst(ctx, &p, ct.baddr, ct.bport))
		return XDP_DROP;
	if (done) {
		bpf_map_delete_elem(&weft_ct, &ck);
		bpf_map_delete_elem(&weft_nat_rev, &rk);
	}
	xdp_count(XDP_STAT_TRANSLATED);
	return XDP_PASS;
}

#endif
