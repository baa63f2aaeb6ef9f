// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// The flow state of weft's per-packet service path (nodeport.c), and the
// steps over it that do not touch the packet: the tc programs and the XDP
// program (xdp.h) both use them, on the same maps, so that a flow started
// on one hook goes on on the other, across a restart of the proxy and a
// change of --bpf-xdp. The maps and the flow rules are described in
// nodeport.c's header comment.

#ifndef WEFT_FLOW_H
#define WEFT_FLOW_H

#include "lb.h"
#include <linux/if_ether.h>

#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10

// Results of the steps below; each hook maps V_PASS and V_DROP to its
// own verdicts.
#define NOT_MINE -1  // not a packet of a frontend or flow of weft's
#define BALANCED -2  // a backend is chosen and recorded
#define V_PASS -3    // to the stack untouched
#define V_DROP -4    // dropped
#define V_HANDOFF -5 // XDP: left untouched to the tc program, which does it
#define FOUND -6     // a packet of a flow in ct, translated as recorded

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
static __always_inline void count(void *map)
{
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(map, &zero);

	if (n)
		(*n)++;
}

// ip_csum writes the checksum of the IPv4 header of hlen bytes (20, or 28
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

// A choice of balance: the frontend's and the backend's flags.
struct choice {
	__u8 svc_flags;  // SVC_*
	__u16 be_flags;  // BACKEND_*
};

// choose picks the backend of a new flow p to an external frontend (see
// maglev in nodeport.c's header) into ct, masq set from the frontend's
// SVC_SNAT. It returns BALANCED, NOT_MINE when p is not for an external
// frontend, V_DROP (a source outside the frontend's ranges, no endpoint
// usable from this node), V_PASS (no endpoint anywhere: the stack answers
// as for a port nobody listens on, a reset or ICMP port unreachable), or
// V_HANDOFF for a frontend with one of the flags handoff (nothing is
// recorded then).
static __always_inline int choose(const struct pkt *p, struct ct_value *ct, __u8 handoff, struct choice *ch)
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
		return V_DROP;
	if (m->count == 0)
		return m->flags & SVC_REJECT ? V_PASS : V_DROP;
	if (m->flags & handoff)
		return V_HANDOFF;
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
				return V_DROP;
			ct->backend_id = slot->backend_id;
		}
		if (m->affinity_timeout) {
			struct ext_affinity_value nv = {.last_ns = now, .backend_id = ct->backend_id};
			bpf_map_update_elem(&weft_ext_affinity, &ak, &nv, BPF_ANY);
		}
	}
	be = bpf_map_lookup_elem(&weft_backends, &ct->backend_id);
	if (!be || be->flags & BACKEND_GONE)
		return V_DROP;
	copy_addr(ct->baddr, be->addr);
	ct->bport = be->port;
	ct->masq = (m->flags & SVC_SNAT) != 0;
	ch->svc_flags = m->flags;
	ch->be_flags = be->flags;
	return BALANCED;
}

// record writes the entries of new flow p going as ct says: the client's
// tuple in ct, and the reply's in nat_rev as it leaves after conntrack
// undid any masquerade (a DSR flow's reply leaves another node). It
// returns BALANCED, or V_DROP when a map is full (counted).
static __always_inline int record(const struct pkt *p, const struct ct_value *ct)
{
	struct tuple rk;
	struct nat_rev_value rv = {.fport = p->t.dport};

	reverse_key(&rk, p, ct);
	copy_addr(rv.faddr, p->t.daddr);
	if ((ct->masq != CT_DSR && bpf_map_update_elem(&weft_nat_rev, &rk, &rv, BPF_ANY)) ||
	    bpf_map_update_elem(&weft_ct, &p->t, ct, BPF_ANY)) {
		count(&weft_ct_failures);
		return V_DROP;
	}
	return BALANCED;
}

// current finds the flow of client packet p in ct. It returns FOUND with
// the flow in ct, rk its reply's tuple and *done set when the flow's
// entries are to go once p is translated (closing); NOT_MINE when there
// is no flow (or its backend is gone: the flow is balanced again); V_PASS
// for a connection the kernel's conntrack translates (CT_KERNEL); or
// V_HANDOFF, untouched, for a flow whose ct_value.masq is a bit of
// handoff (1 << masq).
static __always_inline int current(struct pkt *p, struct ct_value *ct, struct tuple *rk, int *done, __u8 handoff)
{
	struct ct_value *cur = bpf_map_lookup_elem(&weft_ct, &p->t);

	if (cur && cur->masq == CT_KERNEL) {
		if (p->t.proto != IPPROTO_TCP || (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) != TCP_FLAG_SYN)
			return V_PASS;
		cur = 0;
	}
	if (!cur)
		return NOT_MINE;
	struct backend *be = bpf_map_lookup_elem(&weft_backends, &cur->backend_id);
	*ct = *cur;
	if (!be || be->flags & BACKEND_GONE || be->port != ct->bport || !same_addr(be->addr, ct->baddr))
		// The backend is gone: balance the flow again.
		return NOT_MINE;
	if (handoff & (1 << ct->masq))
		return V_HANDOFF;
	reverse_key(rk, p, ct);
	*done = closing(p, cur, 1);
	if (!*done && ct->masq != CT_DSR && !bpf_map_lookup_elem(&weft_nat_rev, rk)) {
		// The LRU map evicted the reply's entry of a flow whose client
		// kept sending: write it again.
		struct nat_rev_value rv = {.fport = p->t.dport};
		copy_addr(rv.faddr, p->t.daddr);
		bpf_map_update_elem(&weft_nat_rev, rk, &rv, BPF_ANY);
	}
	return FOUND;
}

#endif
