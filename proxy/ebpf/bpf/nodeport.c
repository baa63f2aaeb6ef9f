// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// weft's per-packet service path for traffic that no socket of the node
// starts. weft_nodeport runs on the ingress of the node's uplinks: a TCP or
// UDP packet to an external frontend (scope 1 of the services map:
// NodePorts on node addresses, externalIPs, LoadBalancer IPs) gets its
// destination translated to a backend, the client's address kept, and goes
// on to the IP stack (TC_ACT_OK): the kernel routes it, so netfilter sees
// it as it sees any forwarded packet (FORWARD, where NetworkPolicy
// applies, with the client's address, as kube-proxy's iptables mode shows
// it). For eTP Cluster (SVC_SNAT) the program sets the masquerade bit of
// skb->mark (masq_mark); one constant rule of weft's in nat POSTROUTING
// masquerades such packets, and conntrack undoes that on the replies.
// With --bpf-xdp, weft_nodeport_xdp (xdp.h) runs ahead of weft_nodeport
// at the XDP hook of the uplinks and does the same translation there on
// the same maps (flow.h holds the steps both use); weft_nodeport then sets
// the masquerade bit it asks for in the packet's metadata, and does what
// it leaves alone (DSR among it).
// weft_reply runs on the egress of the uplinks, after conntrack: a reply
// of a translated flow (backend -> client) gets its source translated back
// to the frontend.
//
// State (LRU, pinned: flows survive a restart of the proxy):
//   ct: the client's tuple (client -> frontend) -> backend, its id (a
//     flow whose backend left the backends map is balanced again) and
//     whether the flow is masqueraded.
//   nat_rev: the reply's tuple (backend -> client) -> frontend.
//   src_ranges: (frontend id, source prefix), an LPM trie, for frontends
//     with loadBalancerSourceRanges (SVC_RANGES).
//   maglev: frontend id -> its Maglev table, an array of backend ids of
//     maglev_size(count) entries. A new flow takes the entry of its
//     5-tuple's hash, so a flow lands on the same backend on every node
//     and after its state is lost, and a backend change moves at most 1 %
//     of the other backends' flows.
//   ext_affinity: (frontend id, client address) -> backend id and last
//     use, for ClientIP affinity: a new flow of a client seen within the
//     frontend's timeout goes to the backend of its last one, while that
//     backend is an active member (affinity_members, written with the
//     socket programs' affinity); otherwise it is balanced and
//     remembered. A frontend without a table (or a reader between the table's
//     swap and the master entry's) takes a slot of its active list.
// Not handled here (passed to the stack untouched): fragments, IPv6
// extension headers, protocols other than TCP and UDP.
//
// A node whose address is on a Linux bridge (its NIC a port of br0):
// with bridge netfilter on, conntrack sees a frame at the bridge's
// netfilter hook, before the bridge device's ingress; a translation there
// would leave conntrack with the frontend's tuple, and the masquerade of
// eTP Cluster would never be undone on the replies. So on such a node
// weft_nodeport_port runs on the ingress of the bridge's ports instead,
// translating frames addressed to the bridge itself (bridge_ports: port
// -> the bridge's MAC address), and weft_reply on the bridge's egress.
//
// Direct server return (--bpf-lb-mode dsr, or hybrid for TCP only): a
// frontend whose master entry has SVC_DSR (external, eTP Cluster, IPv4)
// sends a flow whose backend is on another node (BACKEND_REMOTE) there
// without masquerade: the destination becomes the backend, the client's
// address stays, and the frontend goes along in an IPv4 option of weft's
// own, 8 bytes right after the 20-byte header:
//   byte 0: DSR_OPT_TYPE (0x9e: copied, class 0, number 30, RFC 4727's
//           experimental option), byte 1: its length, 8,
//   bytes 2-3: the frontend's port, bytes 4-7: its address (network order).
// bpf_skb_adjust_room(BPF_ADJ_ROOM_NET) makes the room; IHL becomes 7,
// total length grows by 8 and the header checksum is computed again (the
// TCP/UDP checksum does not cover IP options). A TCP flow carries it on
// its SYN only (a SYN is small: no MTU question; the backend's node keeps
// the translation for the rest of the connection), a UDP flow on every
// packet: a UDP datagram needs 8 bytes of headroom under the path's MTU,
// or the packet leaves too big (IPv4 fragments it, or DF drops it).
// The ingress node then routes the packet itself (bpf_fib_lookup, then
// bpf_redirect_neigh to the route's device, the TTL decremented; never
// out of a device without Ethernet headers, weft_no_dsr): its
// netfilter and conntrack never see a flow whose replies bypass it (they
// would call the client's later packets INVALID). A new flow whose route
// lookup fails (no route, forwarding off) is masqueraded as with snat
// (weft_dsr_fallbacks counts it); a later packet of a DSR flow whose
// lookup fails goes to the stack as it is (counted too).
// The backend's node (weft_nodeport on its uplinks' ingress, and on the
// VXLAN device's where it exists, whose packets arrive decapsulated
// there) recognises the option on any IPv4 packet with IHL 7: it writes
// nat_rev (backend -> client: frontend), strips the option and passes
// the packet to the stack, so that the pod, its MTU and the node's
// netfilter (NetworkPolicy) see client -> pod as from any client; its
// weft_reply then gives the reply the frontend's address as the source,
// and the reply goes to the client straight from there. An option of
// another type or length is left alone. The option is trusted as any
// packet of the cluster network is: a host that can send packets to a
// pod could as well write its own nat_rev entries that way (the node
// checks nothing that a NodePort of another node would let it check).
// Such a connection's entries go to the LRU (each node sees one side of
// its end only). IPv6 frontends are not given SVC_DSR: they stay
// masqueraded (no destination-options header yet).

#include "flow.h"
#include "xdp.h"
#include <linux/pkt_cls.h>

// returns 0 for those, -1 for anything else.
static __always_inline int parse(struct __sk_buff *skb, struct pkt *p)
{
	__u16 eth_proto;
	__u8 nexthdr;

	if (bpf_skb_load_bytes(skb, 12, &eth_proto, 2) < 0)
		return -1;
	p->l3off = ETH_HLEN;
	if (eth_proto == bpf_htons(ETH_P_IP)) {
		__u8 vihl;
		__u16 frag;
		if (bpf_skb_load_bytes(skb, ETH_HLEN, &vihl, 1) < 0 ||
		    bpf_skb_load_bytes(skb, ETH_HLEN + 6, &frag, 2) < 0 ||
		    bpf_skb_load_bytes(skb, ETH_HLEN + 9, &nexthdr, 1) < 0)
			return -1;
		if ((vihl >> 4) != 4 || (vihl & 0xf) < 5 || (frag & bpf_htons(0x3fff)))
			return -1;
		p->v6 = 0;
		p->t.saddr[0] = p->t.saddr[1] = p->t.daddr[0] = p->t.daddr[1] = 0;
		p->t.saddr[2] = p->t.daddr[2] = bpf_htonl(0xffff);
		if (bpf_skb_load_bytes(skb, ETH_HLEN + 12, &p->t.saddr[3], 4) < 0 ||
		    bpf_skb_load_bytes(skb, ETH_HLEN + 16, &p->t.daddr[3], 4) < 0)
			return -1;
		p->l4off = ETH_HLEN + (vihl & 0xf) * 4;
	} else if (eth_proto == bpf_htons(ETH_P_IPV6)) {
		__u8 vtc;
		if (bpf_skb_load_bytes(skb, ETH_HLEN, &vtc, 1) < 0 ||
		    bpf_skb_load_bytes(skb, ETH_HLEN + 6, &nexthdr, 1) < 0)
			return -1;
		if ((vtc >> 4) != 6)
			return -1;
		p->v6 = 1;
		if (bpf_skb_load_bytes(skb, ETH_HLEN + 8, p->t.saddr, 16) < 0 ||
		    bpf_skb_load_bytes(skb, ETH_HLEN + 24, p->t.daddr, 16) < 0)
			return -1;
		p->l4off = ETH_HLEN + 40;
	} else {
		return -1;
	}
	if (nexthdr != IPPROTO_TCP && nexthdr != IPPROTO_UDP)
		return -1;
	p->t.proto = nexthdr;
	if (bpf_skb_load_bytes(skb, p->l4off, &p->t.sport, 2) < 0 ||
	    bpf_skb_load_bytes(skb, p->l4off + 2, &p->t.dport, 2) < 0)
		return -1;
	if (nexthdr == IPPROTO_TCP && bpf_skb_load_bytes(skb, p->l4off + 13, &p->tcp_flags, 1) < 0)
		return -1;
	return 0;
}


static __always_inline __u32 l4_csum_off(const struct pkt *p)
{
	return p->l4off + (p->t.proto == IPPROTO_TCP ? 16 : 6);
}

static __always_inline __u64 l4_flags(const struct pkt *p)
{
	// A UDP checksum of 0 over IPv4 means none: it stays 0.
	return (p->t.proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0) | (p->v6 ? BPF_F_IPV6 : 0);
}

// set_addr replaces the source (dst 0) or destination address of p with
// to, fixing the IPv4 header's and the TCP/UDP pseudo-header's checksums.
static __always_inline int set_addr(struct __sk_buff *skb, struct pkt *p, int dst, __u32 to[4])
{
	__u32 *from = dst ? p->t.daddr : p->t.saddr;
	__s64 diff;
	int err;

	if (same_addr(from, to))
		return 0;
	if (p->v6) {
		diff = bpf_csum_diff(from, 16, to, 16, 0);
		if (diff < 0)
			return -1;
		err = bpf_l4_csum_replace(skb, l4_csum_off(p), 0, diff, BPF_F_PSEUDO_HDR | l4_flags(p));
		if (!err)
			err = bpf_skb_store_bytes(skb, p->l3off + (dst ? 24 : 8), to, 16, 0);
	} else {
		__u32 off = p->l3off + (dst ? 16 : 12);
		err = bpf_l3_csum_replace(skb, p->l3off + 10, from[3], to[3], 4);
		if (!err)
			err = bpf_l4_csum_replace(skb, l4_csum_off(p), from[3], to[3], BPF_F_PSEUDO_HDR | 4 | l4_flags(p));
		if (!err)
			err = bpf_skb_store_bytes(skb, off, &to[3], 4, 0);
	}
	if (err)
		return -1;
	copy_addr(from, to);
	return 0;
}

// set_port replaces the source (dst 0) or destination port of p.
static __always_inline int set_port(struct __sk_buff *skb, struct pkt *p, int dst, __u16 to)
{
	__u16 *from = dst ? &p->t.dport : &p->t.sport;

	if (*from == to)
		return 0;
	if (bpf_l4_csum_replace(skb, l4_csum_off(p), *from, to, 2 | l4_flags(p)) ||
	    bpf_skb_store_bytes(skb, p->l4off + (dst ? 2 : 0), &to, 2, 0))
		return -1;
	*from = to;
	return 0;
}

// with weft's option) at l3off.
static __always_inline int ip_csum(struct __sk_buff *skb, __u32 l3off, __u32 hlen)
{
	__u16 buf[14] = {};
	__s64 s;
	__u16 csum;

	if (bpf_skb_load_bytes(skb, l3off, buf, hlen) < 0)
		return -1;
	buf[5] = 0;
	s = bpf_csum_diff(0, 0, (__u32 *)buf, hlen, 0);
	if (s < 0)
		return -1;
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	csum = ~s;
	return bpf_skb_store_bytes(skb, l3off + 10, &csum, 2, 0) ? -1 : 0;
}

// dsr_opt_wanted: the packet of a DSR flow carries the frontend (every
// UDP packet, a TCP SYN).
static __always_inline int dsr_opt_wanted(const struct pkt *p)
{
	return p->t.proto == IPPROTO_UDP || (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN;
}

// dsr_route looks the route up from p's client to backend address baddr
// (IPv4, network order) as the node would forward the packet, grown by
// extra bytes; it returns 0 when fib then holds the device and next hop.
static __always_inline int dsr_route(struct __sk_buff *skb, const struct pkt *p, __u32 baddr, __u32 extra,
				     struct bpf_fib_lookup *fib)
{
	__builtin_memset(fib, 0, sizeof(*fib));
	fib->family = 2; // AF_INET
	fib->l4_protocol = p->t.proto;
	fib->sport = p->t.sport;
	fib->dport = p->t.dport;
	// The path's MTU is checked only for a packet the option grows: a
	// larger packet as it came (a GRO aggregate on the uplink) is
	// segmented again on the way out.
	fib->tot_len = extra ? skb->len - p->l3off + extra : 0;
	fib->ipv4_src = p->t.saddr[3];
	fib->ipv4_dst = baddr;
	fib->ifindex = skb->ifindex;
	// Without a neighbour entry yet, the device and next hop are known:
	// bpf_redirect_neigh resolves the neighbour.
	switch (bpf_fib_lookup(skb, fib, sizeof(*fib), 0)) {
	case BPF_FIB_LKUP_RET_SUCCESS:
	case BPF_FIB_LKUP_RET_NO_NEIGH:
		break;
	default:
		return -1;
	}
	__u32 out = fib->ifindex;
	return bpf_map_lookup_elem(&weft_no_dsr, &out) ? -1 : 0;
}

// dsr_insert puts weft's option carrying frontend faddr:fport (network
// order) after p's 20-byte IPv4 header. It returns 1 when the packet
// could not grow (it is unchanged), -1 when it was left broken.
static __always_inline int dsr_insert(struct __sk_buff *skb, struct pkt *p, __u32 faddr, __u16 fport)
{
	struct dsr_opt o = {.type = DSR_OPT_TYPE, .len = DSR_OPT_LEN, .port = fport, .addr = faddr};
	__u8 vihl = 0x40 | (20 + DSR_OPT_LEN) / 4;
	__u16 tot;

	if (bpf_skb_load_bytes(skb, p->l3off + 2, &tot, 2) < 0 ||
	    bpf_skb_adjust_room(skb, DSR_OPT_LEN, BPF_ADJ_ROOM_NET, 0))
		return 1;
	tot = bpf_htons(bpf_ntohs(tot) + DSR_OPT_LEN);
	if (bpf_skb_store_bytes(skb, p->l3off, &vihl, 1, 0) || bpf_skb_store_bytes(skb, p->l3off + 2, &tot, 2, 0) ||
	    bpf_skb_store_bytes(skb, p->l3off + 20, &o, sizeof(o), 0))
		return -1;
	p->l4off += DSR_OPT_LEN;
	return ip_csum(skb, p->l3off, 20 + DSR_OPT_LEN);
}

// ttl_dec decrements the TTL of p, as a router does; it fails when the
// packet is not to be forwarded any more.
static __always_inline int ttl_dec(struct __sk_buff *skb, const struct pkt *p)
{
	__u8 w[2], n[2]; // TTL and protocol, one checksum word

	if (bpf_skb_load_bytes(skb, p->l3off + 8, w, 2) < 0 || w[0] <= 1)
		return -1;
	n[0] = w[0] - 1;
	n[1] = w[1];
	if (bpf_l3_csum_replace(skb, p->l3off + 10, *(__u16 *)w, *(__u16 *)n, 2) ||
	    bpf_skb_store_bytes(skb, p->l3off + 8, n, 1, 0))
		return -1;
	return 0;
}

// dsr_send sends p, translated to its remote backend, to the backend's
// node: the option with frontend faddr:fport when the packet carries it,
// then out of the route's device. A packet the program cannot route goes
// to the stack (counted).
static __always_inline int dsr_send(struct __sk_buff *skb, struct pkt *p, __u32 faddr, __u16 fport)
{
	int opt = dsr_opt_wanted(p) && p->l4off == p->l3off + 20;
	struct bpf_fib_lookup fib;
	int err;

	// err: 0 routed so far, 1 not routed (the packet is unchanged), -1
	// the packet was left broken.
	err = dsr_route(skb, p, p->t.daddr[3], opt ? DSR_OPT_LEN : 0, &fib) ? 1 : 0;
	if (!err && opt)
		err = dsr_insert(skb, p, faddr, fport);
	if (err < 0)
		return TC_ACT_SHOT;
	if (err || ttl_dec(skb, p)) {
		// Not routed here (no route, or the packet cannot grow: a UDP
		// GRO aggregate; or its TTL runs out): the stack has it.
		count(&weft_dsr_fallbacks);
		return TC_ACT_OK;
	}
	struct bpf_redir_neigh nh = {.nh_family = fib.family, .ipv4_nh = fib.ipv4_dst};
	return bpf_redirect_neigh(fib.ifindex, &nh, sizeof(nh), 0);
}

// dsr_receive takes a DSR flow's packet the ingress node sent to a backend
// of this node: it records the reply's translation (backend -> client:
// the frontend of the option), strips the option and passes the packet
// to the stack. It returns NOT_MINE for a packet without weft's option.
static __always_inline int dsr_receive(struct __sk_buff *skb, struct pkt *p)
{
	struct nat_rev_value rv = {}, *cur;
	__u8 vihl = 0x45;
	struct dsr_opt o;
	struct tuple rk;
	__u16 tot;

	if (p->v6 || p->l4off != p->l3off + 20 + DSR_OPT_LEN ||
	    bpf_skb_load_bytes(skb, p->l3off + 20, &o, sizeof(o)) < 0 || o.type != DSR_OPT_TYPE ||
	    o.len != DSR_OPT_LEN)
		return NOT_MINE;
	rk = (struct tuple){.proto = p->t.proto, .sport = p->t.dport, .dport = p->t.sport};
	copy_addr(rk.saddr, p->t.daddr);
	copy_addr(rk.daddr, p->t.saddr);
	rv.fport = o.port;
	rv.faddr[2] = bpf_htonl(0xffff);
	rv.faddr[3] = o.addr;
	cur = bpf_map_lookup_elem(&weft_nat_rev, &rk);
	if (!cur || cur->fport != rv.fport || !same_addr(cur->faddr, rv.faddr)) {
		if (bpf_map_update_elem(&weft_nat_rev, &rk, &rv, BPF_ANY)) {
			count(&weft_ct_failures);
			return TC_ACT_SHOT;
		}
	}
	if (bpf_skb_load_bytes(skb, p->l3off + 2, &tot, 2) < 0 ||
	    bpf_skb_adjust_room(skb, -DSR_OPT_LEN, BPF_ADJ_ROOM_NET, 0))
		return TC_ACT_SHOT;
	tot = bpf_htons(bpf_ntohs(tot) - DSR_OPT_LEN);
	if (bpf_skb_store_bytes(skb, p->l3off, &vihl, 1, 0) || bpf_skb_store_bytes(skb, p->l3off + 2, &tot, 2, 0))
		return TC_ACT_SHOT;
	p->l4off -= DSR_OPT_LEN;
	return ip_csum(skb, p->l3off, 20) ? TC_ACT_SHOT : TC_ACT_OK;
}

// reply translates the source of a reply of a translated flow back
// (backend -> client becomes frontend -> client); it returns NOT_MINE for
// other packets.
static __always_inline int reply(struct __sk_buff *skb, struct pkt *p)
{
	struct nat_rev_value *rv = bpf_map_lookup_elem(&weft_nat_rev, &p->t);
	struct nat_rev_value v;
	struct tuple rk = p->t, ck;
	struct ct_value *c;

	if (!rv)
		return NOT_MINE;
	v = *rv;
	if (set_addr(skb, p, 0, v.faddr) || set_port(skb, p, 0, v.fport))
		return TC_ACT_SHOT;
	if (p->t.proto != IPPROTO_TCP)
		return TC_ACT_OK;
	// The client's tuple: the translated reply, reversed.
	ck = (struct tuple){.sport = p->t.dport, .dport = p->t.sport, .proto = p->t.proto};
	copy_addr(ck.saddr, p->t.daddr);
	copy_addr(ck.daddr, p->t.saddr);
	c = bpf_map_lookup_elem(&weft_ct, &ck);
	if (c && closing(p, c, 0)) {
		bpf_map_delete_elem(&weft_ct, &ck);
		bpf_map_delete_elem(&weft_nat_rev, &rk);
	}
	return TC_ACT_OK;
}

// tc_verdict is the tc verdict of a step's result.
static __always_inline int tc_verdict(int v)
{
	return v == V_DROP ? TC_ACT_SHOT : TC_ACT_OK;
}

// balance starts a flow to an external frontend: it picks a backend
// (flow.h's choose), decides on DSR and records both directions. It
// returns BALANCED, NOT_MINE when p is not for an external frontend, or a
// tc verdict.
static __always_inline int balance(struct __sk_buff *skb, struct pkt *p, struct ct_value *ct)
{
	struct choice ch = {};
	int v = choose(p, ct, 0, &ch);

	if (v != BALANCED)
		return v == NOT_MINE ? NOT_MINE : tc_verdict(v);
	if (ch.svc_flags & SVC_DSR && ch.be_flags & BACKEND_REMOTE && !p->v6 && p->l4off == p->l3off + 20) {
		// The backend's node answers the client itself, if this node
		// can route the packet there; if not, the flow is masqueraded.
		struct bpf_fib_lookup fib;
		if (dsr_route(skb, p, ct->baddr[3], dsr_opt_wanted(p) ? DSR_OPT_LEN : 0, &fib) == 0)
			ct->masq = CT_DSR;
		else
			count(&weft_dsr_fallbacks);
	}
	v = record(p, ct);
	return v == BALANCED ? BALANCED : tc_verdict(v);
}

// forward translates the destination of a packet of a client of an
// external frontend, marking it for masquerade when its frontend says so;
// it returns NOT_MINE for other packets.
static __always_inline int forward(struct __sk_buff *skb, struct pkt *p)
{
	struct tuple ck = p->t, rk;
	struct ct_value ct = {};
	int verdict, done = 0;

	verdict = current(p, &ct, &rk, &done, 0);
	if (verdict == V_PASS)
		return TC_ACT_OK;
	if (verdict == NOT_MINE) {
		verdict = balance(skb, p, &ct);
		if (verdict != BALANCED)
			return verdict;
	}
	__u32 faddr = p->t.daddr[3];
	__u16 fport = p->t.dport;
	if (set_addr(skb, p, 1, ct.baddr) || set_port(skb, p, 1, ct.bport))
		return TC_ACT_SHOT;
	verdict = TC_ACT_OK;
	if (ct.masq == CT_DSR)
		verdict = dsr_send(skb, p, faddr, fport);
	else if (ct.masq)
		skb->mark |= masq_mark;
	if (done) {
		bpf_map_delete_elem(&weft_ct, &ck);
		bpf_map_delete_elem(&weft_nat_rev, &rk);
	}
	return verdict;
}

static __always_inline int nodeport(struct __sk_buff *skb)
{
	struct pkt p = {};
	int verdict;

	if (parse(skb, &p))
		return TC_ACT_OK;
	verdict = dsr_receive(skb, &p);
	if (verdict == NOT_MINE)
		verdict = forward(skb, &p);
	return verdict == NOT_MINE ? TC_ACT_OK : verdict;
}

// xdp_done reports whether weft_nodeport_xdp translated the packet
// already (its metadata, xdp.h), setting the masquerade bit for a flow
// that needs it.
static __always_inline int xdp_done(struct __sk_buff *skb)
{
	__u32 *meta = (void *)(long)skb->data_meta;

	if ((void *)(meta + 1) > (void *)(long)skb->data)
		return 0;
	if (*meta == XDP_META_MASQ) {
		skb->mark |= masq_mark;
		return 1;
	}
	return *meta == XDP_META_DONE;
}

SEC("tc")
int weft_nodeport(struct __sk_buff *skb)
{
	if (xdp_done(skb))
		return TC_ACT_OK;
	return nodeport(skb);
}

SEC("tc")
int weft_nodeport_port(struct __sk_buff *skb)
{
	__u32 idx = skb->ifindex;
	struct bridge_port *bp = bpf_map_lookup_elem(&weft_bridge_ports, &idx);
	struct bridge_port dst = {};

	// Frames the bridge forwards to another host, or floods, are not
	// the node's: they pass untouched.
	if (!bp || bpf_skb_load_bytes(skb, 0, &dst.mac_hi, 4) < 0 || bpf_skb_load_bytes(skb, 4, &dst.mac_lo, 2) < 0 ||
	    dst.mac_hi != bp->mac_hi || dst.mac_lo != bp->mac_lo)
		return TC_ACT_OK;
	return nodeport(skb);
}

SEC("tc")
int weft_reply(struct __sk_buff *skb)
{
	struct pkt p = {};
	int verdict;

	if (parse(skb, &p))
		return TC_ACT_OK;
	verdict = reply(skb, &p);
	return verdict == NOT_MINE ? TC_ACT_OK : verdict;
}

char __license[] SEC("license") = "Dual BSD/GPL";
