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

#include "lb.h"
#include <linux/if_ether.h>
#include <linux/pkt_cls.h>

// TCP header flags (byte 13).
#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10

// Results of the steps below besides tc verdicts.
#define NOT_MINE -1 // not a packet of a frontend or flow of weft's
#define BALANCED -2 // a backend is chosen and recorded

struct tuple {
	__u32 saddr[4];
	__u32 daddr[4];
	__u16 sport; // network byte order
	__u16 dport; // network byte order
	__u8 proto;
	__u8 pad[3];
};

struct ct_value {
	__u32 baddr[4]; // the backend
	__u16 bport;
	__u8 masq;  // the flow is masqueraded (eTP Cluster), or CT_KERNEL
	__u8 fin;   // TCP: CT_FIN_CLIENT and CT_FIN_SERVER, the FINs seen
	__u32 backend_id;
};

// A TCP connection's entries (ct and nat_rev) go with the connection, so
// that a storm of short connections does not push the entries of live
// ones out of the LRU maps: at a reset, or at the last ACK once both sides
// have sent their FIN. The entry of a connection whose end was not seen
// (a lost last ACK, a client that vanished) is left to the LRU.
#define CT_FIN_CLIENT 1
#define CT_FIN_SERVER 2

// CT_KERNEL in ct_value.masq: a TCP connection the kernel's conntrack
// translated (another proxy mode's rules, before weft's eBPF mode took the
// node over; proxy/ebpf writes these entries before it attaches the
// programs). Its packets go to the stack untouched, where its conntrack
// entry goes on translating them; a SYN on the same tuple is a new
// connection, balanced as any.
#define CT_KERNEL 2

// CT_DSR in ct_value.masq: the flow goes to a backend of another node
// with direct server return (the header comment above).
#define CT_DSR 3

// The IPv4 option carrying a DSR flow's frontend (see above).
#define DSR_OPT_TYPE 0x9e
#define DSR_OPT_LEN 8

struct dsr_opt {
	__u8 type;
	__u8 len;
	__u16 port; // network byte order
	__u32 addr; // network byte order
};

struct nat_rev_value {
	__u32 faddr[4]; // the frontend
	__u16 fport;
	__u16 pad;
};

// masq_mark is the skb->mark bit weft's nat POSTROUTING rule masquerades
// (set at load, the --masquerade-bit).
volatile const __u32 masq_mark = 0x4000;

struct src_range_key {
	__u32 prefixlen; // bits of svc_id and addr that count
	__u32 svc_id;    // network byte order, so that it is the prefix's head
	__u32 addr[4];
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct tuple);
	__type(value, struct ct_value);
	__uint(max_entries, 1 << 18);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weft_ct SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct tuple);
	__type(value, struct nat_rev_value);
	__uint(max_entries, 1 << 18);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weft_nat_rev SEC(".maps");

struct maglev_table {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_INNER_MAP); // tables of any size
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__type(key, __u32);
	__uint(max_entries, 1 << 16);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct maglev_table);
} weft_maglev SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct src_range_key);
	__type(value, __u8);
	__uint(max_entries, 1 << 16);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weft_src_ranges SEC(".maps");

struct bridge_port {
	__u32 mac_hi; // the bridge's MAC address, bytes 0-3
	__u16 mac_lo; // bytes 4-5
	__u16 pad;
};

// Not pinned: each proxy fills its own at start, before attaching.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32); // the port's ifindex
	__type(value, struct bridge_port);
	__uint(max_entries, 1024);
} weft_bridge_ports SEC(".maps");

// weft_dsr_fallbacks counts the packets of DSR frontends that could not
// be routed by the program (per CPU; weft_ebpf_dsr_fallbacks_total):
// new flows masqueraded instead, later packets passed to the stack.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
} weft_dsr_fallbacks SEC(".maps");

// weft_no_dsr: the devices a DSR packet must not leave by (ifindex ->
// 1), those without Ethernet headers (WireGuard's, IPIP's): the receive
// side, weft_nodeport, parses Ethernet frames and does not run on them at
// the other end. A flow routed out of one is masqueraded. Not pinned: each
// proxy fills its own at every sync.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, __u8);
	__uint(max_entries, 1024);
} weft_no_dsr SEC(".maps");

// pkt is a parsed TCP or UDP packet.
struct pkt {
	struct tuple t;
	__u32 l3off, l4off;
	__u8 v6;
	__u8 tcp_flags; // TCP: the header's flags byte
};

// weft_ct_failures counts the flows balanced whose entries could not be
// written (per CPU; weft_ebpf_ct_insert_failures_total).
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
} weft_ct_failures SEC(".maps");

static __always_inline void copy_addr(__u32 dst[4], const __u32 src[4])
{
	dst[0] = src[0];
	dst[1] = src[1];
	dst[2] = src[2];
	dst[3] = src[3];
}

static __always_inline int same_addr(const __u32 a[4], const __u32 b[4])
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3];
}

// parse fills p for an unfragmented TCP or UDP packet over Ethernet; it
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

// closing notes a TCP segment of flow c (from the client when client):
// it returns 1 when the flow's entries are to go once the segment is
// translated (a reset, or the last ACK after both FINs).
static __always_inline int closing(const struct pkt *p, struct ct_value *c, int client)
{
	__u8 f = p->tcp_flags;

	if (p->t.proto != IPPROTO_TCP)
		return 0;
	if (f & TCP_FLAG_RST)
		return 1;
	if (f & TCP_FLAG_FIN) {
		c->fin |= client ? CT_FIN_CLIENT : CT_FIN_SERVER;
		return 0;
	}
	return (f & TCP_FLAG_ACK) && c->fin == (CT_FIN_CLIENT | CT_FIN_SERVER);
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

static __always_inline void count(void *map)
{
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(map, &zero);

	if (n)
		(*n)++;
}

// ip_csum writes the checksum of the IPv4 header of hlen bytes (20, or 28
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

// in_ranges reports whether the source of p is in a source range of
// frontend svc_id.
static __always_inline int in_ranges(const struct pkt *p, __u32 svc_id)
{
	struct src_range_key k = {.prefixlen = 32 + 128, .svc_id = bpf_htonl(svc_id)};

	copy_addr(k.addr, p->t.saddr);
	return bpf_map_lookup_elem(&weft_src_ranges, &k) != 0;
}

// maglev_size is the Maglev table size of a frontend with n backends: the
// first prime of the list of at least 1000*n (maglevSizes in maglev.go).
static __always_inline __u32 maglev_size(__u32 n)
{
	if (n <= 1)
		return 1021;
	if (n <= 2)
		return 2039;
	if (n <= 4)
		return 4093;
	if (n <= 8)
		return 8191;
	if (n <= 16)
		return 16381;
	if (n <= 32)
		return 32749;
	return 65521;
}

// mix and hash_end are MurmurHash3's 32-bit steps.
static __always_inline __u32 mix(__u32 h, __u32 k)
{
	k *= 0xcc9e2d51;
	k = (k << 15) | (k >> 17);
	k *= 0x1b873593;
	h ^= k;
	h = (h << 13) | (h >> 19);
	return h * 5 + 0xe6546b64;
}

static __always_inline __u32 hash_end(__u32 h)
{
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

static __always_inline __u32 hash_addr(__u32 h, const __u32 a[4])
{
	return mix(mix(mix(mix(h, a[0]), a[1]), a[2]), a[3]);
}

// flow_hash is the hash of p's 5-tuple.
static __always_inline __u32 flow_hash(const struct pkt *p)
{
	__u32 h = hash_addr(0, p->t.saddr);
	h = hash_addr(h, p->t.daddr);
	h = mix(h, ((__u32)p->t.sport << 16) | p->t.dport);
	h = mix(h, p->t.proto);
	return hash_end(h);
}

struct ext_affinity_key {
	__u32 svc_id;
	__u32 addr[4]; // the client
};

struct ext_affinity_value {
	__u64 last_ns;
	__u32 backend_id;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ext_affinity_key);
	__type(value, struct ext_affinity_value);
	__uint(max_entries, 1 << 16);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weft_ext_affinity SEC(".maps");

// remembered returns 1 and sets *id to the backend of the last flow of
// p's client to frontend m when that was within m's affinity timeout and
// the backend is still an active member; ak and now are filled for
// remember.
static __always_inline int remembered(const struct pkt *p, const struct svc_value *m, struct ext_affinity_key *ak,
				      __u64 *now, __u32 *id)
{
	struct ext_affinity_value *av;

	ak->svc_id = m->svc_id;
	copy_addr(ak->addr, p->t.saddr);
	*now = bpf_ktime_get_ns();
	av = bpf_map_lookup_elem(&weft_ext_affinity, ak);
	if (!av || *now - av->last_ns >= (__u64)m->affinity_timeout * 1000000000ULL)
		return 0;
	struct affinity_member mk = {.svc_id = m->svc_id, .backend_id = av->backend_id};
	if (!bpf_map_lookup_elem(&weft_affinity_members, &mk))
		return 0;
	av->last_ns = *now;
	*id = av->backend_id;
	return 1;
}

// maglev_pick returns the backend id of hash n in frontend m's table.
static __always_inline __u32 *maglev_pick(const struct svc_value *m, __u32 n)
{
	void *table = bpf_map_lookup_elem(&weft_maglev, &m->svc_id);
	__u32 idx;

	if (!table)
		return 0;
	idx = n % maglev_size(m->count);
	return bpf_map_lookup_elem(table, &idx);
}

// reverse_key is the reply's tuple of client flow p going to c's backend.
static __always_inline void reverse_key(struct tuple *rk, const struct pkt *p, const struct ct_value *c)
{
	*rk = (struct tuple){.proto = p->t.proto, .sport = c->bport, .dport = p->t.sport};
	copy_addr(rk->saddr, c->baddr);
	copy_addr(rk->daddr, p->t.saddr);
}

// balance starts a flow to an external frontend: it picks a backend (see
// maglev above) and records both directions. It returns BALANCED,
// NOT_MINE when p is not for an external frontend, or a tc verdict.
static __always_inline int balance(struct __sk_buff *skb, struct pkt *p, struct ct_value *ct)
{
	struct svc_key key = {.port = p->t.dport, .proto = p->t.proto, .scope = SCOPE_EXTERNAL};
	struct svc_value *m, *slot;
	struct backend *be;
	__u32 n, *id;

	copy_addr(key.addr, p->t.daddr);
	m = bpf_map_lookup_elem(&weft_services, &key);
	if (!m)
		return NOT_MINE;
	if (m->flags & SVC_RANGES && !in_ranges(p, m->svc_id))
		return TC_ACT_SHOT;
	if (m->count == 0)
		// No endpoint anywhere: the stack answers as for a port nobody
		// listens on (a reset, or ICMP port unreachable). Endpoints but
		// none here (eTP Local): dropped.
		return m->flags & SVC_REJECT ? TC_ACT_OK : TC_ACT_SHOT;
	struct ext_affinity_key ak = {};
	__u64 now = 0;
	if (!m->affinity_timeout || !remembered(p, m, &ak, &now, &ct->backend_id)) {
		n = flow_hash(p);
		id = maglev_pick(m, n);
		if (id) {
			ct->backend_id = *id;
		} else {
			key.slot = slot_of(m, n);
			slot = bpf_map_lookup_elem(&weft_services, &key);
			if (!slot)
				return TC_ACT_SHOT;
			ct->backend_id = slot->backend_id;
		}
		if (m->affinity_timeout) {
			struct ext_affinity_value nv = {.last_ns = now, .backend_id = ct->backend_id};
			bpf_map_update_elem(&weft_ext_affinity, &ak, &nv, BPF_ANY);
		}
	}
	be = bpf_map_lookup_elem(&weft_backends, &ct->backend_id);
	if (!be || be->flags & BACKEND_GONE)
		return TC_ACT_SHOT;
	copy_addr(ct->baddr, be->addr);
	ct->bport = be->port;
	ct->masq = (m->flags & SVC_SNAT) != 0;
	if (m->flags & SVC_DSR && be->flags & BACKEND_REMOTE && !p->v6 && p->l4off == p->l3off + 20) {
		// The backend's node answers the client itself, if this node
		// can route the packet there; if not, the flow is masqueraded.
		struct bpf_fib_lookup fib;
		if (dsr_route(skb, p, ct->baddr[3], dsr_opt_wanted(p) ? DSR_OPT_LEN : 0, &fib) == 0)
			ct->masq = CT_DSR;
		else
			count(&weft_dsr_fallbacks);
	}

	// The reply, as it leaves after conntrack undid any masquerade (a
	// DSR flow's leaves another node).
	struct tuple rk;
	struct nat_rev_value rv = {.fport = p->t.dport};
	reverse_key(&rk, p, ct);
	copy_addr(rv.faddr, p->t.daddr);
	if ((ct->masq != CT_DSR && bpf_map_update_elem(&weft_nat_rev, &rk, &rv, BPF_ANY)) ||
	    bpf_map_update_elem(&weft_ct, &p->t, ct, BPF_ANY)) {
		count(&weft_ct_failures);
		return TC_ACT_SHOT;
	}
	return BALANCED;
}

// forward translates the destination of a packet of a client of an
// external frontend, marking it for masquerade when its frontend says so;
// it returns NOT_MINE for other packets.
static __always_inline int forward(struct __sk_buff *skb, struct pkt *p)
{
	struct tuple ck = p->t, rk;
	struct ct_value *cur = bpf_map_lookup_elem(&weft_ct, &ck);
	struct ct_value ct = {};
	int verdict, done = 0;

	if (cur && cur->masq == CT_KERNEL) {
		if (p->t.proto != IPPROTO_TCP || (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) != TCP_FLAG_SYN)
			return TC_ACT_OK;
		cur = 0;
	}
	if (cur) {
		struct backend *be = bpf_map_lookup_elem(&weft_backends, &cur->backend_id);
		ct = *cur;
		if (!be || be->flags & BACKEND_GONE || be->port != ct.bport || !same_addr(be->addr, ct.baddr))
			// The backend is gone: balance the flow again.
			cur = 0;
	}
	if (cur) {
		reverse_key(&rk, p, &ct);
		done = closing(p, cur, 1);
		if (!done && ct.masq != CT_DSR && !bpf_map_lookup_elem(&weft_nat_rev, &rk)) {
			// The LRU map evicted the reply's entry of a flow whose
			// client kept sending: write it again.
			struct nat_rev_value rv = {.fport = p->t.dport};
			copy_addr(rv.faddr, p->t.daddr);
			bpf_map_update_elem(&weft_nat_rev, &rk, &rv, BPF_ANY);
		}
	} else {
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

SEC("tc")
int weft_nodeport(struct __sk_buff *skb)
{
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
