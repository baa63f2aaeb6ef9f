// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// What weft's socket programs (sock.c) and per-packet programs
// (nodeport.c) share: the frontend and backend maps, written by proxy/ebpf.
// Every address is 16 bytes in network order, IPv4 as ::ffff:a.b.c.d.
//
//   services: (address, port, protocol, scope, slot) -> entry. Scope 0
//     holds the frontends the socket programs translate (ClusterIPs, and
//     NodePorts, externalIPs and LoadBalancer IPs reached from the node
//     itself); scope 1 those the per-packet programs translate for
//     traffic from outside the node (with the external traffic policy's
//     endpoints). Slot 0 is the frontend's master entry: its backend
//     count, the half of the slot space holding its active list, flags
//     and its id. The active list is slots half*SLOT_HALF+1 ..
//     half*SLOT_HALF+count. An update writes the other half, then the
//     master entry with the new count and half, so a reader sees the old
//     list or the new one, never a mix.
//   backends: backend id -> address, port and flags. A backend that left
//     every list is first marked BACKEND_GONE, and deleted only once every
//     program that could have read a list naming it has returned (a grace
//     period, proxy/ebpf's retire): a socket program that read a master
//     entry just before its update still finds the backend of the old
//     list. The per-packet programs treat a marked backend as gone.
//   affinity_members: (frontend id, backend id) for the active backends of
//     frontends with ClientIP affinity: a remembered backend (sock.c's
//     affinity, nodeport.c's ext_affinity) that left the frontend's list
//     is not used, even while other frontends keep it.

#ifndef WEFT_LB_H
#define WEFT_LB_H

#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

// The slot space of a frontend is two halves of SLOT_HALF slots.
#define SLOT_HALF 32768

// Frontend scopes.
#define SCOPE_SOCKET 0
#define SCOPE_EXTERNAL 1

// Master entry flags.
#define SVC_REJECT 1 // no endpoint anywhere: connection refused
#define SVC_DROP 2   // endpoints, none usable from this node: dropped
#define SVC_SNAT 4   // external: the source becomes the node's (eTP Cluster)
#define SVC_RANGES 8 // external: only sources in the frontend's ranges
#define SVC_DSR 16   // external, IPv4: a remote backend answers the client itself (nodeport.c)

// Backend flags.
#define BACKEND_GONE 1   // in no active list: deleted after a grace period
#define BACKEND_REMOTE 2 // on another node (a frontend with SVC_DSR sends it its flows directly)

struct svc_key {
	__u32 addr[4];
	__u16 port; // network byte order
	__u8 proto;
	__u8 scope; // SCOPE_*
	__u16 slot;
	__u16 pad2;
};

struct svc_value {
	__u32 backend_id; // slots: the backend
	__u16 count;      // master: active backends
	__u8 half;        // master: 0 or 1, which half holds the active list
	__u8 flags;       // master: SVC_*
	__u32 svc_id;     // master: the frontend's id
	__u32 affinity_timeout; // master: seconds, 0 without affinity
};

struct backend {
	__u32 addr[4];
	__u16 port;  // network byte order
	__u16 flags; // BACKEND_*
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct svc_key);
	__type(value, struct svc_value);
	__uint(max_entries, 1 << 19);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weft_services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct backend);
	__uint(max_entries, 1 << 18);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weft_backends SEC(".maps");

struct affinity_member {
	__u32 svc_id;
	__u32 backend_id;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct affinity_member);
	__type(value, __u8);
	__uint(max_entries, 1 << 18);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weft_affinity_members SEC(".maps");

// slot_of is the slot holding the n-th active backend of master m.
static __always_inline __u16 slot_of(const struct svc_value *m, __u32 n)
{
	return (__u16)(m->half ? SLOT_HALF : 0) + (__u16)(n % m->count) + 1;
}

#endif
