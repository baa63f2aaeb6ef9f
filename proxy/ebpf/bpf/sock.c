// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// weft's socket-level service load balancer: cgroup v2 hooks that translate
// a Service address to a backend when a socket connects (TCP, connected
// UDP) or sends a datagram (unconnected UDP), so that no packet of
// east-west traffic is ever NATed, and that translate the backend back to
// the Service address where the application can see it (recvmsg for UDP
// replies, getpeername).
//
// Maps (services, backends and affinity_members: see lb.h; revnat: see
// revnat.h):
//   affinity: (network namespace cookie, frontend id) -> backend id and
//     last use, for ClientIP session affinity (a pod has one namespace).

#include "lb.h"
#include "revnat.h"

#define ECONNREFUSED 111
#define ETIMEDOUT 110

struct affinity_key {
	__u64 netns_cookie;
	__u32 svc_id;
	__u32 pad;
};

struct affinity_value {
	__u64 last_ns;
	__u32 backend_id;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct affinity_key);
	__type(value, struct affinity_value);
	__uint(max_entries, 1 << 16);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weft_affinity SEC(".maps");

static __always_inline void v4_addr(__u32 addr[4], __u32 ip)
{
	addr[0] = 0;
	addr[1] = 0;
	addr[2] = bpf_htonl(0xffff);
	addr[3] = ip;
}

static __always_inline void v6_addr(__u32 addr[4], struct bpf_sock_addr *ctx)
{
	addr[0] = ctx->user_ip6[0];
	addr[1] = ctx->user_ip6[1];
	addr[2] = ctx->user_ip6[2];
	addr[3] = ctx->user_ip6[3];
}

static __always_inline int is_v4_mapped(const __u32 addr[4])
{
	return addr[0] == 0 && addr[1] == 0 && addr[2] == bpf_htonl(0xffff);
}

// pick returns the backend for a new socket of the frontend m.
static __always_inline struct backend *pick(struct bpf_sock_addr *ctx, struct svc_key *key,
					    struct svc_value *m, __u32 *id)
{
	struct affinity_key ak = {};
	struct affinity_value *av = 0;
	__u64 now = 0;
	__u32 n;

	if (m->affinity_timeout) {
		ak.netns_cookie = bpf_get_netns_cookie(ctx);
		ak.svc_id = m->svc_id;
		now = bpf_ktime_get_ns();
		av = bpf_map_lookup_elem(&weft_affinity, &ak);
		if (av && now - av->last_ns < (__u64)m->affinity_timeout * 1000000000ULL) {
			struct affinity_member mk = {.svc_id = m->svc_id, .backend_id = av->backend_id};
			struct backend *be = 0;
			if (bpf_map_lookup_elem(&weft_affinity_members, &mk))
				be = bpf_map_lookup_elem(&weft_backends, &av->backend_id);
			if (be) {
				av->last_ns = now;
				*id = av->backend_id;
				return be;
			}
		}
	}
	if (ctx->protocol == IPPROTO_UDP)
		// A datagram socket keeps its backend: clients such as
		// resolvers expect one peer per socket.
		n = (__u32)bpf_get_socket_cookie(ctx);
	else
		n = bpf_get_prandom_u32();
	key->slot = slot_of(m, n);
	struct svc_value *slot = bpf_map_lookup_elem(&weft_services, key);
	if (!slot)
		return 0;
	*id = slot->backend_id;
	// A backend marked BACKEND_GONE is used as it is: only a program that
	// read m before its update reaches one (lb.h), and the socket it
	// connects is one the resets after the grace period find.
	struct backend *be = bpf_map_lookup_elem(&weft_backends, id);
	if (be && m->affinity_timeout) {
		struct affinity_value nv = {.last_ns = now, .backend_id = *id};
		bpf_map_update_elem(&weft_affinity, &ak, &nv, BPF_ANY);
	}
	return be;
}

// translate rewrites the destination addr:port of ctx when it is a
// frontend; it returns the hook's verdict.
static __always_inline int translate(struct bpf_sock_addr *ctx, __u32 addr[4], int v6)
{
	struct svc_key key = {};
	struct svc_value *m;
	struct backend *be;
	__u32 id = 0;

	if (ctx->protocol != IPPROTO_TCP && ctx->protocol != IPPROTO_UDP)
		return 1;
	__builtin_memcpy(key.addr, addr, sizeof(key.addr));
	key.port = (__u16)ctx->user_port;
	key.proto = (__u8)ctx->protocol;
	m = bpf_map_lookup_elem(&weft_services, &key);
	if (!m)
		return 1;
	if (m->count == 0) {
		// No packet leaves: the caller gets the error a client of
		// kube-proxy's REJECT (refused) or DROP (timed out) would.
		bpf_set_retval(m->flags & SVC_REJECT ? -ECONNREFUSED : -ETIMEDOUT);
		return 0;
	}
	be = pick(ctx, &key, m, &id);
	if (!be)
		return 1;

	struct revnat_key rk = {.cookie = bpf_get_socket_cookie(ctx), .port = be->port};
	struct revnat_value rv = {.port = key.port};
	__builtin_memcpy(rk.addr, be->addr, sizeof(rk.addr));
	__builtin_memcpy(rv.addr, addr, sizeof(rv.addr));
	bpf_map_update_elem(&weft_revnat, &rk, &rv, BPF_ANY);

	if (v6) {
		ctx->user_ip6[0] = be->addr[0];
		ctx->user_ip6[1] = be->addr[1];
		ctx->user_ip6[2] = be->addr[2];
		ctx->user_ip6[3] = be->addr[3];
	} else {
		if (!is_v4_mapped(be->addr))
			return 1;
		ctx->user_ip4 = be->addr[3];
	}
	ctx->user_port = be->port;
	return 1;
}

// reverse shows the frontend instead of the backend a socket was
// translated to (a datagram's source, a connected socket's peer).
static __always_inline int reverse(struct bpf_sock_addr *ctx, __u32 addr[4], int v6)
{
	struct revnat_key rk = {.cookie = bpf_get_socket_cookie(ctx), .port = (__u16)ctx->user_port};
	struct revnat_value *rv;

	__builtin_memcpy(rk.addr, addr, sizeof(rk.addr));
	rv = bpf_map_lookup_elem(&weft_revnat, &rk);
	if (!rv)
		return 1;
	if (v6) {
		ctx->user_ip6[0] = rv->addr[0];
		ctx->user_ip6[1] = rv->addr[1];
		ctx->user_ip6[2] = rv->addr[2];
		ctx->user_ip6[3] = rv->addr[3];
	} else {
		ctx->user_ip4 = rv->addr[3];
	}
	ctx->user_port = rv->port;
	return 1;
}

SEC("cgroup/connect4")
int weft_connect4(struct bpf_sock_addr *ctx)
{
	__u32 addr[4];
	v4_addr(addr, ctx->user_ip4);
	return translate(ctx, addr, 0);
}

SEC("cgroup/sendmsg4")
int weft_sendmsg4(struct bpf_sock_addr *ctx)
{
	__u32 addr[4];
	v4_addr(addr, ctx->user_ip4);
	return translate(ctx, addr, 0);
}

SEC("cgroup/recvmsg4")
int weft_recvmsg4(struct bpf_sock_addr *ctx)
{
	__u32 addr[4];
	v4_addr(addr, ctx->user_ip4);
	return reverse(ctx, addr, 0);
}

SEC("cgroup/getpeername4")
int weft_getpeername4(struct bpf_sock_addr *ctx)
{
	__u32 addr[4];
	v4_addr(addr, ctx->user_ip4);
	return reverse(ctx, addr, 0);
}

SEC("cgroup/connect6")
int weft_connect6(struct bpf_sock_addr *ctx)
{
	__u32 addr[4];
	v6_addr(addr, ctx);
	return translate(ctx, addr, 1);
}

SEC("cgroup/sendmsg6")
int weft_sendmsg6(struct bpf_sock_addr *ctx)
{
	__u32 addr[4];
	v6_addr(addr, ctx);
	return translate(ctx, addr, 1);
}

SEC("cgroup/recvmsg6")
int weft_recvmsg6(struct bpf_sock_addr *ctx)
{
	__u32 addr[4];
	v6_addr(addr, ctx);
	return reverse(ctx, addr, 1);
}

SEC("cgroup/getpeername6")
int weft_getpeername6(struct bpf_sock_addr *ctx)
{
	__u32 addr[4];
	v6_addr(addr, ctx);
	return reverse(ctx, addr, 1);
}

char __license[] SEC("license") = "Dual BSD/GPL";
