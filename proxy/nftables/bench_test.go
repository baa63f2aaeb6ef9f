package nftables_test

import (
	"fmt"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/proxy/model"
	"github.com/weftnet/weft/proxy/nftables"
	"github.com/weftnet/weft/proxy/proxytest"
)

// benchObjects are n ClusterIP Services (ports http and echo) with ten
// ready endpoints each on other nodes.
func benchObjects(n int) ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
	svcs := make([]*corev1.Service, n)
	sl := make([]*discoveryv1.EndpointSlice, n)
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		svcs[i] = proxytest.Service(name, fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), nil)
		var eps []proxytest.Endpoint
		for j := range 10 {
			k := i*10 + j
			eps = append(eps, proxytest.Endpoint{IP: netip.AddrFrom4([4]byte{10, 244, byte(k >> 8), byte(k)}).String(),
				Node: fmt.Sprintf("peer-%d", k%100)})
		}
		sl[i] = proxytest.Slice(name, eps...)
	}
	return svcs, sl
}

// BenchmarkKernelSync times syncs through nft into the kernel (in the test's
// private network namespace): the first one over n Services, and a partial
// one after one endpoint of one Service moved (one transaction of element
// writes). The tracker feeds it, as in the proxier.
func BenchmarkKernelSync(b *testing.B) {
	if !netnsutil.Isolated() {
		b.Skip("kernel benchmark: needs root (private network namespace)")
	}
	cfg := nftables.Config{NodeName: proxytest.NodeName, Families: []int{4},
		NodePortIPs:  []netip.Addr{netip.MustParseAddr(proxytest.NodeIP)},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix(proxytest.Cluster)}}
	for _, n := range []int{1000, 10000} {
		svcs, sl := benchObjects(n)
		tr := model.NewTracker()
		for _, s := range svcs {
			tr.OnService(nil, s)
		}
		for _, es := range sl {
			tr.OnEndpointSlice(nil, es)
		}
		st, _, _ := tr.Snapshot()
		b.Run(fmt.Sprintf("FromScratch/%d", n), func(b *testing.B) {
			for b.Loop() {
				be, err := nftables.New(cfg)
				if err != nil {
					b.Fatal(err)
				}
				if err := be.Sync(st, false); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := be.Cleanup(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
		b.Run(fmt.Sprintf("OneChange/%d", n), func(b *testing.B) {
			be, err := nftables.New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = be.Cleanup() }()
			if err := be.Sync(st, false); err != nil {
				b.Fatal(err)
			}
			i := 0
			for b.Loop() {
				old := sl[0]
				moved := old.DeepCopy()
				moved.Endpoints[0].Addresses = []string{fmt.Sprintf("10.245.%d.%d", i/250%250, i%250+1)}
				i++
				tr.OnEndpointSlice(old, moved)
				sl[0] = moved
				cur, _, _ := tr.Snapshot()
				if err := be.Sync(cur, false); err != nil {
					b.Fatal(err)
				}
				if s := be.LastStats; s.Full || s.Rules != 0 {
					b.Fatalf("one change: %+v", s)
				}
			}
		})
	}
}
