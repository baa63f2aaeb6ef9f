// Package cni is the weft CNI plugin: it wires a pod's network namespace to the
// node's bridge and hands out its addresses from weft's own IPAM.
//
// One plugin process serves one command (ADD, DEL, CHECK, STATUS, GC) of the
// CNI 1.1 specification. The plugin is deliberately lean, because each
// command is a process start: IPAM runs in-process (no second exec as with
// bridge + host-local), the CNI protocol is served by the plugin's own
// entry point (skel.go) rather than the reference skeleton, ADD's netlink
// requests go in batches through a small rtnetlink client with one socket
// per namespace (rtnl.go), and nothing that is already in place is
// rewritten.
//
// Ordering is what keeps a failure from leaking: ADD allocates addresses before
// it touches the kernel, then creates the veth pair with its peer directly in
// the pod namespace, and undoes both if any later step fails. DEL and GC work
// from the plugin's own state (the IPAM store and the deterministic host-side
// veth names), so they need neither the runtime's cache nor the pod namespace.
// DEL returns once the pod's interface has left the pod namespace; the
// node's reaper (reap.go, reaper.go) finishes deleting the pair after it.
package cni
