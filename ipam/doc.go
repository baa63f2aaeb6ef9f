// Package ipam is weft's IP address management: it hands each pod
// interface one address from every configured range set and remembers the
// allocation across CNI invocations.
//
// # Design
//
// The package has two halves that meet only at the State type.
//
// The allocator (Pool) is pure. NewPool validates and normalises the
// user's "ipam.ranges" configuration once; Allocate, Release, Lookup and
// Free are plain functions of (Pool, State) that never touch the disk,
// never log and never keep hidden state of their own. Everything an
// allocation decision depends on is in State, so the allocator is easy to
// test exhaustively with an in-memory State and a plugin invocation is
// simply "load State, call Pool, save State". Allocate is all-or-nothing:
// on error (for example ErrExhausted in one range set of a dual-stack
// pool) the State is left exactly as it was.
//
// Persistence (Store) is separate. DiskStore keeps one network's State in
// <dataDir>/<network>/state.json (see NetworkDir) and serialises all
// access to it, across goroutines and processes, with flock(2) on
// <dataDir>/<network>/lock:
//
//   - Update takes LOCK_EX, loads state.json, runs the caller's function,
//     and, only if the function returned nil and changed the State,
//     writes the new State before unlocking. View takes LOCK_SH and never
//     writes.
//   - The lock file is never deleted or renamed, so every process always
//     locks the same inode. Each operation opens its own descriptor, which
//     makes one DiskStore safe for concurrent use by many goroutines.
//   - Saving is atomic: the State is written to state.json.tmp-<pid> and
//     renamed over state.json. A reader therefore sees either the old or
//     the new file, never a torn one. If a process dies while holding the
//     lock (even by SIGKILL), the kernel drops the flock and the previous
//     state.json is intact; stale temporary files are removed by the next
//     Update.
//   - Durability is paid once per boot. The first save after a boot
//     fsyncs the file and the directory and then records the kernel's
//     boot_id in <dataDir>/<network>/boot (durably too); the saves after
//     it skip fsync, which costs a pod start nothing that a running
//     kernel could lose. Only a kernel crash or a power loss can leave
//     such a state.json stale or torn, and that also ends every pod it
//     describes: on the next boot a stale state.json holds only dead
//     allocations (GC releases them) and a torn one is read as empty.
//   - A missing state.json is an empty State. A state.json saved in this
//     boot (or before weft recorded boots) that cannot be parsed is
//     reported as an error wrapping ErrCorruptState and naming the file;
//     it is never silently reset, because forgetting allocations would
//     hand out addresses that running pods still use.
//
// # Address selection
//
// Within a range set, Allocate uses next-after-last rotation: State
// remembers, per range set, the address most recently handed out, and
// the next allocation takes the first free address after it, walking the
// set's ranges in configuration order and wrapping around from the end of
// the last range to the start of the first. A just-released address is
// therefore not reused until the whole set has been cycled through, which
// keeps stale conntrack entries, ARP/NDP caches and lingering connections
// aimed at a deleted pod from reaching its successor.
//
// The network address, every range's gateway and, for IPv4, the subnet's
// broadcast address are never handed out, even when they lie inside
// [rangeStart, rangeEnd]. Allocate on a key that already holds valid
// addresses returns them unchanged, so a repeated CNI ADD is idempotent;
// addresses that no longer fit the pool (the configuration changed) are
// replaced.
//
// Finding the next free address skips only addresses that are in use or
// reserved, so it costs O(allocations) rather than O(range size), and
// Free counts without enumerating ranges, so IPv6 /64 ranges are cheap.
package ipam
