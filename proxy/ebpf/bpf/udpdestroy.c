// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// Terminating connected UDP sockets whose backend left their Service. The
// socket programs (sock.c) connect a UDP socket to the backend itself, so
// removing the backend from the maps does not move it: a resolver keeping
// its socket would keep asking a backend that is gone. This UDP socket
// iterator, run by proxy/ebpf after a sync in every network namespace of
// the node's cgroup, destroys (bpf_sock_destroy, Linux >= 6.5) each
// connected UDP socket whose (socket cookie, peer) the socket programs
// translated (weft_revnat) for a Service from which that backend was
// removed (weft_udp_stale, written by proxy/ebpf for this run). The
// application's next receive fails with ECONNABORTED and the socket is
// disconnected; a client that opens a new socket is balanced again. Each
// destroyed socket's cookie is written to the iterator's output.

#include <linux/bpf.h>
#include <linux/in6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_core_read.h>

#include "revnat.h"

#define AF_INET 2
#define AF_INET6 10
#define TCP_ESTABLISHED 1 // a connected UDP socket's state

// The kernel's types, as far as this program reads them (CO-RE: the
// offsets come from the running kernel's BTF).
struct sock_common {
	__be32 skc_daddr;
	__be16 skc_dport;
	unsigned short skc_family;
	volatile unsigned char skc_state;
	struct in6_addr skc_v6_daddr;
} __attribute__((preserve_access_index));

struct sock {
	struct sock_common __sk_common;
} __attribute__((preserve_access_index));

struct udp_sock;

struct bpf_iter_meta {
	struct seq_file *seq;
} __attribute__((preserve_access_index));

struct bpf_iter__udp {
	struct bpf_iter_meta *meta;
	struct udp_sock *udp_sk;
} __attribute__((preserve_access_index));

extern int bpf_sock_destroy(struct sock_common *sk) __ksym;

// A (Service address and port, backend address and port) pair of a UDP
// frontend whose backend was removed; addresses as in lb.h.
struct udp_stale_key {
	__u32 svc_addr[4];
	__u32 backend_addr[4];
	__u16 svc_port;     // network byte order
	__u16 backend_port; // network byte order
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct udp_stale_key);
	__type(value, __u8);
	__uint(max_entries, 1 << 16);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} weft_udp_stale SEC(".maps");

SEC("iter/udp")
int weft_udp_destroy(struct bpf_iter__udp *ctx)
{
	struct sock *sk = (struct sock *)ctx->udp_sk;
	struct revnat_key rk = {};
	struct udp_stale_key stale = {};
	struct revnat_value *rv;
	__u64 cookie;

	if (!sk || sk->__sk_common.skc_state != TCP_ESTABLISHED)
		return 0;
	switch (sk->__sk_common.skc_family) {
	case AF_INET:
		rk.addr[2] = bpf_htonl(0xffff);
		rk.addr[3] = sk->__sk_common.skc_daddr;
		break;
	case AF_INET6:
		BPF_CORE_READ_INTO(&rk.addr, sk, __sk_common.skc_v6_daddr);
		break;
	default:
		return 0;
	}
	rk.port = sk->__sk_common.skc_dport;
	cookie = bpf_get_socket_cookie(sk);
	rk.cookie = cookie;
	rv = bpf_map_lookup_elem(&weft_revnat, &rk);
	if (!rv)
		return 0; // not translated by weft (or its entry was evicted)
	__builtin_memcpy(stale.svc_addr, rv->addr, sizeof(stale.svc_addr));
	__builtin_memcpy(stale.backend_addr, rk.addr, sizeof(stale.backend_addr));
	stale.svc_port = rv->port;
	stale.backend_port = rk.port;
	if (!bpf_map_lookup_elem(&weft_udp_stale, &stale))
		return 0;
	if (bpf_sock_destroy((struct sock_common *)sk))
		return 0;
	bpf_map_delete_elem(&weft_revnat, &rk);
	bpf_seq_write(ctx->meta->seq, &cookie, sizeof(cookie));
	return 0;
}

char __license[] SEC("license") = "Dual BSD/GPL";
