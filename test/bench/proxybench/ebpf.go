package main

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	weftebpf "github.com/weftnet/weft/proxy/ebpf"
	"github.com/weftnet/weft/proxy/model"
	"github.com/weftnet/weft/test/bench/benchlab"
)

// ebpfEnv is where weft-proxy --mode ebpf runs in the bench: a bpffs and
// the cgroup v2 hierarchy, mounted by the bench in its private mount
// namespace (the proxy, a child, sees the same mounts; the namespace's own
// /sys hides the host's cgroup mount), and an empty cgroup the bench made
// there, so that the socket programs translate nobody's sockets.
type ebpfEnv struct {
	*benchlab.BPFMounts
	cgroup string
}

// pin is the proxy's pin path; each run starts from an empty one.
func (e *ebpfEnv) pin() string { return filepath.Join(e.BPFFS, "weft") }

// newEBPFEnv mounts the file systems and creates the cgroup.
func newEBPFEnv() (*ebpfEnv, error) {
	m, err := benchlab.MountBPF()
	if err != nil {
		return nil, err
	}
	e := &ebpfEnv{BPFMounts: m, cgroup: filepath.Join(m.Cgroup2, fmt.Sprintf("weft-proxybench-%d", os.Getpid()))}
	if err := os.Mkdir(e.cgroup, 0o755); err != nil {
		m.Unmount()
		return nil, fmt.Errorf("creating the bench cgroup: %w", err)
	}
	return e, nil
}

// reset removes what an earlier run pinned: its maps, and its links,
// whose programs detach with the last reference.
func (e *ebpfEnv) reset() error { return os.RemoveAll(e.pin()) }

// close removes the cgroup and unmounts the file systems (the pins go
// with the bpffs).
func (e *ebpfEnv) close() {
	_ = os.Remove(e.cgroup)
	e.Unmount()
}

// dump reads the pinned maps as weft-proxy --dump prints them: one line
// per frontend with its backends as address:port.
func (e *ebpfEnv) dump() (string, error) {
	var buf bytes.Buffer
	err := weftebpf.Dump(e.pin(), &buf)
	return buf.String(), err
}

// await polls the pinned maps every millisecond until the frontend
// vip:80/TCP has the backend ip:endpointPort, and returns the time since
// t0 at which it did.
func (e *ebpfEnv) await(ctx context.Context, vip, ip string, t0 time.Time, timeout time.Duration) (time.Duration, error) {
	r, err := weftebpf.OpenReader(e.pin())
	if err != nil {
		return 0, err
	}
	defer r.Close()
	a, err := netip.ParseAddr(vip)
	if err != nil {
		return 0, fmt.Errorf("ClusterIP %q: %w", vip, err)
	}
	fk := weftebpf.FrontendKey{Addr: a, Port: 80, Protocol: model.TCP}
	want := netip.AddrPortFrom(netip.MustParseAddr(ip), endpointPort)
	for {
		// A read racing the proxy's write can meet a slot whose backend
		// the write has just removed: read again.
		bes, err := r.Backends(fk)
		if err == nil && slices.Contains(bes, want) {
			return time.Since(t0), nil
		}
		if time.Since(t0) > timeout {
			return 0, fmt.Errorf("the maps do not hold %s for %s after %v (last read: %v)", want, vip, timeout, err)
		}
		if err := sleep(ctx, time.Millisecond); err != nil {
			return 0, err
		}
	}
}
