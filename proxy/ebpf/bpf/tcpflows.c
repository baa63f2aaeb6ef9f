// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// Finding the TCP connections the socket programs (sock.c) translated to a
// backend that has since left its Service. Such a socket is connected to
// the backend itself, so conntrack cannot tell through which Service it
// went; weft_revnat can: (socket cookie, backend) -> the Service address
// the application connected to. This TCP socket iterator, run by
// proxy/ebpf in every network namespace of the node's cgroup, writes one
// record per open connection (established or closing) whose backend is in
// weft_tcp_gone (written by proxy/ebpf for this run) and that weft
// translated: the socket's own address and port, the backend's, and the
// Service's. proxy/ebpf keeps those whose Service the backend left, and
// resets them at the client (internal/tcpreset).

#include <linux/bpf.h>
#include <linux/in6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_core_read.h>

#include "revnat.h"

#define AF_INET 2
#define AF_INET6 10

// TCP states of an open connection (include/net/tcp_states.h).
#define TCP_ESTABLISHED 1
#define TCP_FIN_WAIT1 4
#define TCP_FIN_WAIT2 5
#define TCP_CLOSE_WAIT 8
#define TCP_LAST_ACK 9

// The kernel's types, as far as this program reads them (CO-RE).
struct sock_common {
	__be32 skc_daddr;
	__be32 skc_rcv_saddr;
	__be16 skc_dport;
	__u16 skc_num;
	unsigned short skc_family;
	volatile unsigned char skc_state;
	struct in6_addr skc_v6_daddr;
	struct in6_addr skc_v6_rcv_saddr;
} __attribute__((preserve_access_index));

struct sock {
	struct sock_common __sk_common;
} __attribute__((preserve_access_index));

struct bpf_iter_meta {
	struct seq_file *seq;
} __attribute__((preserve_access_index));

struct bpf_iter__tcp {
	struct bpf_iter_meta *meta;
	struct sock_common *sk_common;
} __attribute__((preserve_access_index));

// A backend that left a Service; addresses as in lb.h.
struct tcp_gone_key {
	__u32 addr[4];
	__u16 port; // network byte order
	__u16 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct tcp_gone_key);
	__type(value, __u8);
	__uint(max_entries, 1 << 16);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} weft_tcp_gone SEC(".maps");

// One connection found: ports in network byte order.
struct tcp_flow {
	__u32 local[4];
	__u32 backend[4];
	__u32 frontend[4];
	__u16 local_port;
	__u16 backend_port;
	__u16 frontend_port;
	__u16 pad;
};

SEC("iter/tcp")
int weft_tcp_flows(struct bpf_iter__tcp *ctx)
{
	struct sock_common *skc = ctx->sk_common;
	struct revnat_key rk = {};
	struct tcp_gone_key gone = {};
	struct tcp_flow flow = {};
	struct revnat_value *rv;
	unsigned char state;

	if (!skc)
		return 0;
	state = skc->skc_state;
	if (state != TCP_ESTABLISHED && state != TCP_FIN_WAIT1 && state != TCP_FIN_WAIT2 && state != TCP_CLOSE_WAIT &&
	    state != TCP_LAST_ACK)
		return 0; // also: listening, time-wait and request sockets, which are not full sockets
	switch (skc->skc_family) {
	case AF_INET:
		gone.addr[2] = flow.local[2] = bpf_htonl(0xffff);
		gone.addr[3] = skc->skc_daddr;
		flow.local[3] = skc->skc_rcv_saddr;
		break;
	case AF_INET6:
		BPF_CORE_READ_INTO(&gone.addr, skc, skc_v6_daddr);
		BPF_CORE_READ_INTO(&flow.local, skc, skc_v6_rcv_saddr);
		break;
	default:
		return 0;
	}
	gone.port = skc->skc_dport;
	if (!bpf_map_lookup_elem(&weft_tcp_gone, &gone))
		return 0;
	__builtin_memcpy(rk.addr, gone.addr, sizeof(rk.addr));
	rk.port = gone.port;
	rk.cookie = bpf_get_socket_cookie((struct sock *)skc);
	rv = bpf_map_lookup_elem(&weft_revnat, &rk);
	if (!rv)
		return 0; // not translated by weft (or its entry was evicted)
	__builtin_memcpy(flow.backend, gone.addr, sizeof(flow.backend));
	__builtin_memcpy(flow.frontend, rv->addr, sizeof(flow.frontend));
	flow.local_port = bpf_htons(skc->skc_num);
	flow.backend_port = gone.port;
	flow.frontend_port = rv->port;
	bpf_seq_write(ctx->meta->seq, &flow, sizeof(flow));
	return 0;
}

char __license[] SEC("license") = "Dual BSD/GPL";
