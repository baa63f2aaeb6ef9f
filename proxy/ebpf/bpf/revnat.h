// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// The socket programs' reverse translation map, shared by sock.c (which
// writes it when it translates a socket and reads it in recvmsg and
// getpeername) and udpdestroy.c (which finds the Service a connected
// socket was translated for): (socket cookie, backend address, port) ->
// Service address and port. Addresses as in lb.h.

#ifndef WEFT_REVNAT_H
#define WEFT_REVNAT_H

struct revnat_key {
	__u64 cookie;
	__u32 addr[4];
	__u16 port; // network byte order
	__u16 pad;
	__u32 pad2;
};

struct revnat_value {
	__u32 addr[4];
	__u16 port; // network byte order
	__u16 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct revnat_key);
	__type(value, struct revnat_value);
	__uint(max_entries, 1 << 16);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weft_revnat SEC(".maps");

#endif
