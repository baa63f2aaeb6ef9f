package userspace_test

import (
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/proxy"
	"github.com/weftnet/weft/proxy/model"
	"github.com/weftnet/weft/proxy/proxytest"
	"github.com/weftnet/weft/proxy/userspace"
)

// BenchmarkDataPath measures, in one run, the connection rate and the
// throughput of one client (the benchmark process, as the node) to one
// server pod (a namespace on a veth), four ways: dialling the pod
// directly; through the nftables backend's DNAT (ClusterIP 10.96.0.10);
// through the userspace proxy reached by its nftables REDIRECT glue
// (ClusterIP 10.96.0.11); and through the rootless userspace proxy on
// 127.0.0.1. A connection is connect, one byte each way, and a close with
// a reset (no TIME_WAIT to run out of ports); throughput is 64 KiB writes
// on one connection, counted by the server.
//
//	go test -run '^$' -bench DataPath -benchtime 3s ./proxy/userspace/
//
// Run as root (the benchmark's private network namespace).
func BenchmarkDataPath(b *testing.B) {
	if !netnsutil.Isolated() {
		b.Skip("needs root (a private network namespace)")
	}
	server := proxytest.BenchPod(b, "", "usbench-pod", "usbench0")
	nodeIP := netip.MustParseAddr("10.244.1.1")
	build := func(c proxy.Config, st model.State) proxy.Backend {
		c.NodeName, c.NodeIPs, c.ClusterCIDRs = proxytest.NodeName, []netip.Addr{nodeIP}, []netip.Prefix{netip.MustParsePrefix(proxytest.Cluster)}
		_, be, err := proxy.Build(c)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = be.Cleanup() })
		if err := be.Sync(st, true); err != nil {
			b.Fatal(err)
		}
		return be
	}
	// Each backend programs its own Service only: two tables NATing one
	// address would race.
	build(proxy.Config{Mode: "nftables"}, benchState(b, "nft", "10.96.0.10", server))
	us := benchState(b, "us", "10.96.0.11", server)
	build(proxy.Config{Mode: "userspace", Userspace: userspace.Config{Glue: "nftables"}}, us)
	rootless := build(proxy.Config{Mode: "userspace", Userspace: userspace.Config{Listen: netip.MustParseAddr("127.0.0.1")}}, us).(*userspace.Backend)
	var local string
	for _, e := range rootless.Services() {
		if e.Service == "default/us" && e.Port == "http" {
			local = e.Address
		}
	}
	direct := server.String()
	targets := []struct{ name, addr string }{
		{"nftables", "10.96.0.10:80"},
		{"userspace", "10.96.0.11:80"},
		{"userspace-rootless", local},
	}
	// Each op runs the target and the direct dial back to back, so that
	// both see the same load of the (shared) machine; the ratio is the
	// target's rate over the direct one's.
	for _, tg := range targets {
		b.Run("conn/"+tg.name, func(b *testing.B) {
			proxytest.OneConn(b, tg.addr) // warm: the proxy programmed, caches filled
			proxytest.OneConn(b, direct)
			var dt, dd time.Duration
			for b.Loop() {
				t0 := time.Now()
				proxytest.OneConn(b, direct)
				t1 := time.Now()
				proxytest.OneConn(b, tg.addr)
				dd, dt = dd+t1.Sub(t0), dt+time.Since(t1)
			}
			report(b, "conn/s", float64(b.N), dt, dd)
		})
	}
	for _, tg := range targets {
		b.Run("bytes/"+tg.name, func(b *testing.B) {
			to, dc := streamTo(b, tg.addr), streamTo(b, direct)
			var dt, dd time.Duration
			for b.Loop() {
				t0 := time.Now()
				dc.round(b)
				t1 := time.Now()
				to.round(b)
				dd, dt = dd+t1.Sub(t0), dt+time.Since(t1)
			}
			report(b, "MB/s", float64(b.N)*proxytest.BenchRoundBytes/1e6, dt, dd)
		})
	}
}

// report reports a rate of the target (n units in dt), the direct
// dial's (n in dd) and their ratio.
func report(b *testing.B, unit string, n float64, dt, dd time.Duration) {
	b.ReportMetric(n/dt.Seconds(), unit)
	b.ReportMetric(n/dd.Seconds(), "direct-"+unit)
	b.ReportMetric(dd.Seconds()/dt.Seconds(), "x-direct")
}

// benchState is one Service on the server pod.
func benchState(b *testing.B, name, clusterIP string, server netip.AddrPort) model.State {
	b.Helper()
	ep := proxytest.Endpoint{IP: server.Addr().String(), Node: proxytest.NodeName}
	st, errs := model.Build([]*corev1.Service{proxytest.Service(name, clusterIP, nil)}, []*discoveryv1.EndpointSlice{proxytest.Slice(name, ep)})
	if len(errs) > 0 {
		b.Fatal(errs)
	}
	return st
}

// stream is a connection for the throughput measure.
type stream struct {
	c    *net.TCPConn
	data []byte
}

func streamTo(b *testing.B, addr string) *stream {
	b.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	tc := c.(*net.TCPConn)
	if _, err := tc.Write([]byte{'T'}); err != nil {
		b.Fatal(err)
	}
	return &stream{c: tc, data: make([]byte, 64<<10)}
}

// round sends proxytest.BenchRoundBytes and waits for the server to have
// them all.
func (s *stream) round(b *testing.B) {
	for sent := 0; sent < proxytest.BenchRoundBytes; sent += len(s.data) {
		if _, err := s.c.Write(s.data); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := io.ReadFull(s.c, s.data[:1]); err != nil {
		b.Fatal(err)
	}
}
