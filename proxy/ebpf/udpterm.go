package ebpf

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/netnsutil"
)

// staleUDP is a backend removed from a UDP frontend of the socket
// programs: connected sockets translated for the frontend to it are to be
// terminated.
type staleUDP struct {
	frontend, backend netip.AddrPort
}

// udpTerminator ends the connected UDP sockets that the socket programs
// connected to a backend that has since left the Service
// (bpf/udpdestroy.c). Sockets belong to network namespaces and the
// iterator sees those of the namespace it is opened in, so it is opened
// in every network namespace that a thread of the node's cgroup (the one
// the socket programs serve) is in: the node's own and each pod's.
type udpTerminator struct {
	objs   udpdestroyObjects
	iter   *link.Iter
	cgroup string
}

// loadUDPTerminator loads the iterator, sharing the socket programs'
// weft_revnat map revnat. A kernel without bpf_sock_destroy (Linux < 6.5)
// or UDP iterators gives an error wrapping ebpf.ErrNotSupported.
func loadUDPTerminator(cgroup string, revnat *ebpf.Map) (*udpTerminator, error) {
	u := &udpTerminator{cgroup: cgroup}
	spec, err := loadUdpdestroy()
	if err == nil {
		err = spec.LoadAndAssign(&u.objs, sharingRevnat(spec, revnat))
	}
	if err != nil {
		return nil, fmt.Errorf("loading the UDP socket iterator: %w", err)
	}
	it, err := link.AttachIter(link.IterOptions{Program: u.objs.WeftUdpDestroy})
	if err != nil {
		_ = u.objs.Close()
		return nil, fmt.Errorf("attaching the UDP socket iterator: %w", err)
	}
	u.iter = it
	return u, nil
}

func (u *udpTerminator) close() {
	_ = u.iter.Close()
	_ = u.objs.Close()
}

// maxStale is the most stale pairs one iterator run takes (the size of
// weft_udp_stale).
const maxStale = 1 << 16

// terminate destroys the connected UDP sockets translated to the stale
// pairs, in every network namespace of the cgroup's threads, and returns
// how many it destroyed.
func (u *udpTerminator) terminate(stale []staleUDP) (int, error) {
	total := 0
	for len(stale) > 0 {
		chunk := stale[:min(len(stale), maxStale)]
		stale = stale[len(chunk):]
		n, err := u.terminateChunk(chunk)
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

func (u *udpTerminator) terminateChunk(stale []staleUDP) (int, error) {
	keys := make([]udpdestroyUdpStaleKey, len(stale))
	vals := make([]uint8, len(stale))
	for i, s := range stale {
		keys[i] = udpdestroyUdpStaleKey{SvcAddr: toWords(s.frontend.Addr()), SvcPort: htons(s.frontend.Port()),
			BackendAddr: toWords(s.backend.Addr()), BackendPort: htons(s.backend.Port())}
	}
	if _, err := u.objs.WeftUdpStale.BatchUpdate(keys, vals, nil); err != nil {
		return 0, fmt.Errorf("writing %d removed UDP backends: %w", len(keys), err)
	}
	defer func() {
		_, _ = u.objs.WeftUdpStale.BatchDelete(keys, nil)
	}()
	n := 0
	err := readIter(u.iter, u.cgroup, func(out []byte) { n += len(out) / 8 }) // a cookie per socket destroyed
	return n, err
}

// readIter runs the socket iterator it in every network namespace of the
// cgroup's threads and hands each namespace's output to each.
func readIter(it *link.Iter, cgroup string, each func(out []byte)) error {
	nets, err := netnsOf(cgroup)
	if err != nil {
		return err
	}
	var errs []error
	for _, path := range nets {
		err := netnsutil.Do(path, func() error {
			// The iterator walks the namespace it is opened in.
			r, err := it.Open()
			if err != nil {
				return err
			}
			defer r.Close()
			out, err := io.ReadAll(r)
			each(out)
			return err
		})
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("network namespace %s: %w", path, err))
		}
	}
	return errors.Join(errs...)
}

// netnsOf returns a path to each network namespace a thread of the cgroup
// tree at root is in, one per namespace. Threads, not processes: a
// process's threads may be in other namespaces than its first (a pod's
// sockets opened by a thread of a node process that entered the pod).
func netnsOf(root string) ([]string, error) {
	type nsID struct{ dev, ino uint64 }
	seen := map[nsID]bool{}
	var out []string
	err := filepath.WalkDir(root, func(dir string, d fs.DirEntry, err error) error {
		if err != nil {
			if dir != root && errors.Is(err, os.ErrNotExist) {
				return nil // a cgroup removed meanwhile
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, pid := range strings.Fields(string(b)) {
			if _, err := strconv.Atoi(pid); err != nil {
				continue
			}
			tasks, err := os.ReadDir(filepath.Join("/proc", pid, "task"))
			if err != nil {
				continue // the process has exited
			}
			for _, t := range tasks {
				path := filepath.Join("/proc", pid, "task", t.Name(), "ns", "net")
				var st unix.Stat_t
				if unix.Stat(path, &st) != nil {
					continue // the thread has exited
				}
				if id := (nsID{st.Dev, st.Ino}); !seen[id] {
					seen[id] = true
					out = append(out, path)
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing the network namespaces of cgroup %s: %w", root, err)
	}
	return out, nil
}
