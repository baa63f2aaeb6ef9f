package ebpf_test

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/weftnet/weft/proxy"
	weftebpf "github.com/weftnet/weft/proxy/ebpf"
	"github.com/weftnet/weft/proxy/model"
	"github.com/weftnet/weft/proxy/proxytest"
)

// BenchmarkClusterIPConnRate: new TCP connections per second from the node
// to a ClusterIP through the socket programs (connect-time translation),
// the maps holding 1k and 100k other Services, measured interleaved in one
// run, and the ratio (issue 27: at least 0.95). Each size's backend has a
// cgroup of its own (under a cgroup2 mount of the benchmark's, as setup
// makes them) and a pin path on a bpffs of its own; the process joins the
// size's cgroup before its connections. See proxytest.BenchConnRate.
//
//	go test -run '^$' -bench ClusterIPConnRate -benchtime 6x ./proxy/ebpf
//
// Run as root.
func BenchmarkClusterIPConnRate(b *testing.B) {
	proxytest.BenchConnRate(b, proxytest.ConnRateBackend{Mode: "ebpf", Prepare: connRateCgroup,
		Enter: func(b *testing.B, c proxy.Config) {
			if err := join(c.CgroupRoot, os.Getpid()); err != nil {
				b.Fatal(err)
			}
		},
		Programmed: ebpfProgrammed})
}

// connRateCgroup gives one size's backend a cgroup and a pin path of its
// own; the cleanup moves the process back and removes the cgroup.
func connRateCgroup(b *testing.B, c *proxy.Config) {
	cg2, bpffs := benchMount(b, "cgroup2"), benchMount(b, "bpf")
	self, err := ownCgroup()
	if err != nil {
		b.Fatal(err)
	}
	if err := sweepCgroups(cg2); err != nil {
		b.Fatal(err)
	}
	cg, err := os.MkdirTemp(cg2, fmt.Sprintf("%s%d-", cgroupPrefix, os.Getpid()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := removeCgroup(cg, filepath.Join(cg2, self)); err != nil {
			b.Errorf("removing the benchmark's cgroup: %v", err)
		}
	})
	c.CgroupRoot, c.BPFPinPath = cg, filepath.Join(bpffs, "weft")
}

// benchMount mounts a file system of type fs on a new temporary directory
// (the process has a mount namespace of its own: netnsutil.RunTests).
func benchMount(b *testing.B, fs string) string {
	dir := b.TempDir()
	if err := unix.Mount(fs, dir, fs, 0, ""); err != nil {
		b.Fatalf("mounting %s: %v", fs, err)
	}
	b.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// ebpfProgrammed reads the pinned maps as the programs do: each TCP
// frontend of svc must hold the backends Render gives it.
func ebpfProgrammed(c proxy.Config, svc *corev1.Service, eps *discoveryv1.EndpointSlice) error {
	r, err := weftebpf.OpenReader(c.BPFPinPath)
	if err != nil {
		return err
	}
	defer r.Close()
	st, errs := model.Build([]*corev1.Service{svc}, []*discoveryv1.EndpointSlice{eps})
	if len(errs) > 0 {
		return fmt.Errorf("%v", errs)
	}
	fronts := weftebpf.Render(weftebpf.Config{NodeName: c.NodeName}, st)
	for _, p := range svc.Spec.Ports {
		k := weftebpf.FrontendKey{Addr: netip.MustParseAddr(svc.Spec.ClusterIP), Port: uint16(p.Port), Protocol: model.TCP}
		want := fronts[k].Backends
		got, err := r.Backends(k)
		if err != nil || len(got) == 0 || !slices.Equal(got, want) {
			return fmt.Errorf("frontend %s: backends %v %v, want %v", k, got, err, want)
		}
	}
	return nil
}
