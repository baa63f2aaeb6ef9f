package nftables_test

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"testing"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/proxy/nftables"
	"github.com/weftnet/weft/proxy/proxytest"
)

// BenchmarkKernelSync times syncs through nft into the kernel (in the test's
// private network namespace): the first one over n Services (1k and 10k;
// WEFT_NFT_SERVICES=N for N alone), and a partial one after one endpoint
// of one Service moved (one transaction of element writes). The tracker
// feeds it, as in the proxier.
func BenchmarkKernelSync(b *testing.B) {
	if !netnsutil.Isolated() {
		b.Skip("kernel benchmark: needs root (private network namespace)")
	}
	cfg := nftables.Config{NodeName: proxytest.NodeName, Families: []int{4},
		NodePortIPs:  []netip.Addr{netip.MustParseAddr(proxytest.NodeIP)},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix(proxytest.Cluster)}}
	sizes := []int{1000, 10000}
	if v := os.Getenv("WEFT_NFT_SERVICES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("WEFT_NFT_SERVICES=%q: want a number of Services", v)
		}
		sizes = []int{n}
	}
	for _, n := range sizes {
		svcs, sl := proxytest.BenchObjects(n)
		tr := proxytest.BenchTracker(svcs, sl)
		st, _ := tr.Snapshot()
		b.Run(fmt.Sprintf("FromScratch/%d", n), func(b *testing.B) {
			cpu := proxytest.StartCPU(b)
			defer cpu.Report(b, "nft-cpu-ms/op")
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
			cpu := proxytest.StartCPU(b)
			defer cpu.Report(b, "nft-cpu-ms/op")
			for b.Loop() {
				proxytest.MoveEndpoint(tr, sl, i)
				i++
				cur, _ := tr.Snapshot()
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

// BenchmarkRender times the renderer alone on a first render of n
// Services (10k; WEFT_NFT_SERVICES=N for N), the tracker's snapshot
// prepared outside the timing: what a first sync computes before it
// writes to the kernel. self-cpu-ms/op counts the garbage collector's
// work too, which on a loaded machine the wall time hides or inflates.
func BenchmarkRender(b *testing.B) {
	n := 10000
	if v := os.Getenv("WEFT_NFT_SERVICES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			b.Fatalf("WEFT_NFT_SERVICES=%q: want a number of Services", v)
		}
	}
	cfg := nftables.Config{NodeName: proxytest.NodeName, Families: []int{4},
		NodePortIPs:  []netip.Addr{netip.MustParseAddr(proxytest.NodeIP)},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix(proxytest.Cluster)}}
	svcs, sl := proxytest.BenchObjects(n)
	st, _ := proxytest.BenchTracker(svcs, sl).Snapshot()
	b.Run(strconv.Itoa(n), func(b *testing.B) {
		cpu := proxytest.StartCPU(b)
		defer cpu.Report(b, "nft-cpu-ms/op")
		for b.Loop() {
			nftables.NewRenderer(cfg).Update(st)
		}
	})
}
