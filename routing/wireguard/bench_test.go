package wireguard_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/routing"
	"github.com/weftnet/weft/routing/wireguard"
)

// BenchmarkPodToPod measures TCP from pod-1 to pod-2 across two nodes of
// the kernel tests' cluster (newCluster), four ways: plain host-gw (the
// cluster as built), plain VXLAN (package routing's VXLAN mode in place of
// the host-gw routes), and WireGuard over host-gw with the userspace and
// the kernel implementation (the kernel's only where the kernel has
// WireGuard: it skips here). Per variant:
//
//   - bulk: one connection per op sending bulkBytes, which pod-2's sink
//     counts and reports back; fewer bytes than sent fails the benchmark.
//     Reported as MB/s (10^6 bytes).
//   - conn: one connection per op (connect, one line each way to pod-2's
//     echo server, close). Reported as conns/s.
//
// Every variant but host-gw has its own cluster, and each of its ops runs
// the same op over the host-gw cluster first, back to back, so that both
// see the same load of the machine: it also reports host-gw's rate of
// those ops (hostgw-MB/s, hostgw-conns/s) and its own over that
// (x-hostgw); ns/op is then the time of both. The end of the run logs
// these as one table (on stdout).
//
// The pods' links have an MTU of 1500 as in the kernel tests: on the
// encapsulating variants pod-1 learns the tunnel's smaller path MTU at the
// warm-up transfer, so its segments carry 50 (VXLAN) or 60 (WireGuard)
// bytes less than host-gw's, as in a cluster whose pod MTU leaves room for
// the tunnel.
//
//	go test -run '^$' -bench PodToPod -benchtime 20x ./routing/wireguard
//
// Run as root (the private network namespaces).
func BenchmarkPodToPod(b *testing.B) {
	if testing.Short() {
		b.Skip("kernel benchmark: skipped with -short")
	}
	if !netnsutil.Isolated() {
		b.Skip("kernel benchmark: needs root to run in private network namespaces")
	}
	plain := newBenchCluster(b, benchVariants[0])
	results := make([]benchResult, len(benchVariants))
	for i, v := range benchVariants {
		r := &results[i]
		b.Run(v.name, func(b *testing.B) {
			c := plain
			if i > 0 {
				if v.impl != "" {
					if r.skipped = unavailable(v.impl); r.skipped != "" {
						b.Skip(r.skipped)
					}
				}
				c = newBenchCluster(b, v)
			}
			b.Run("bulk", func(b *testing.B) {
				r.mbps, r.hostgwMBps = paired(b, plain, c, "MB/s", bulkBytes/1e6, func(c *cluster) error {
					return bulk(c.node(1).pod, 2, bulkBytes)
				})
			})
			b.Run("conn", func(b *testing.B) {
				r.conns, r.hostgwConns = paired(b, plain, c, "conns/s", 1, func(c *cluster) error {
					want := "pod-2 saw 10.244.1.2 ping"
					if ans, err := ask(c.node(1).pod, 2, "ping", 5*time.Second); err != nil || ans != want {
						return fmt.Errorf("pod-1 to pod-2: %q, %v; want %q", ans, err, want)
					}
					return nil
				})
			})
		})
	}
	var table strings.Builder
	w := tabwriter.NewWriter(&table, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "variant\tMB/s\thostgw MB/s\tx hostgw\tconns/s\thostgw conns/s\tx hostgw\t")
	for i, r := range results {
		switch {
		case r.skipped != "":
			fmt.Fprintf(w, "%s\t  skipped: %s\n", benchVariants[i].name, r.skipped)
			continue
		case r.mbps == 0 && r.conns == 0:
			continue // not run (-bench)
		}
		fmt.Fprintf(w, "%s\t", benchVariants[i].name)
		for _, m := range [][2]float64{{r.mbps, r.hostgwMBps}, {r.conns, r.hostgwConns}} {
			if m[0] == 0 {
				fmt.Fprint(w, "-\t-\t-\t")
				continue
			}
			fmt.Fprintf(w, "%.0f\t%.0f\t%.2f\t", m[0], m[1], m[0]/m[1])
		}
		fmt.Fprintln(w)
	}
	w.Flush()
	// To stdout: the go command prints a parent benchmark's log only with -v.
	fmt.Printf("BenchmarkPodToPod, pod-1 to pod-2 (x hostgw: the variant's rate over host-gw's in the same ops):\n%s", table.String())
}

// A benchVariant is one way pod traffic crosses between the nodes.
type benchVariant struct {
	name  string
	vxlan bool                     // package routing's VXLAN mode instead of host-gw
	impl  wireguard.Implementation // WireGuard over host-gw; "": none
	// device is the one on node-1 that pod traffic must cross ("": eth0).
	device string
}

// benchVariants[0] is the reference the others run against.
var benchVariants = []benchVariant{
	{name: "hostgw"},
	{name: "vxlan", vxlan: true, device: routing.DefaultDevice},
	{name: "wireguard-" + string(wireguard.Userspace), impl: wireguard.Userspace, device: wireguard.DefaultDevice},
	{name: "wireguard-" + string(wireguard.Kernel), impl: wireguard.Kernel, device: wireguard.DefaultDevice},
}

// benchResult is one variant's rates and host-gw's in the same ops (for
// host-gw itself: its rates).
type benchResult struct {
	mbps, hostgwMBps   float64
	conns, hostgwConns float64
	skipped            string
}

const (
	sinkPort  = podPort + 1
	bulkBytes = 64 << 20
	warmBytes = 4 << 20
)

// newBenchCluster is a two-node cluster with a bulk sink in pod-2, set up
// as v says and warmed: pod-1 reached pod-2 through v's device.
func newBenchCluster(b *testing.B, v benchVariant) *cluster {
	b.Helper()
	impl := v.impl
	if impl == "" {
		impl = wireguard.Auto // never applied: no device is made
	}
	c := newCluster(b, impl, 2)
	c.serveSink(c.node(2))
	// Many short connections from pod-1 to one address: let it reuse ports
	// in TIME_WAIT, so that a long -benchtime does not run out of them.
	c.do(c.node(1).pod, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/tcp_tw_reuse", []byte("1"), 0o644)
	})
	switch {
	case v.vxlan:
		c.vxlan()
	case v.impl != "":
		c.sync()
	}
	// The first exchange waits for the tunnel (WireGuard's handshake); the
	// transfer makes pod-1 learn the path MTU and proves that its bytes
	// went through v's device.
	eventually(b, c.node(1).pod, 2, "warm", "pod-2 saw 10.244.1.2 warm")
	var before uint64
	if v.device != "" {
		before = c.txBytes(c.node(1).ns, v.device)
	}
	if err := bulk(c.node(1).pod, 2, warmBytes); err != nil {
		b.Fatalf("%s: %v", v.name, err)
	}
	if v.device != "" {
		if sent := c.txBytes(c.node(1).ns, v.device) - before; sent < warmBytes {
			b.Fatalf("%s: node-1's %s sent %d bytes during a %d-byte transfer from its pod: pod traffic does not cross it", v.name, v.device, sent, warmBytes)
		}
	}
	return c
}

// vxlan replaces every node's host-gw routes with package routing's VXLAN
// mode, each node's agent applying what Compute makes of all nodes.
func (c *cluster) vxlan() {
	c.t.Helper()
	self := func(nd *node) routing.Node {
		name := nd.published.Name
		return routing.Node{Name: name, InternalIPs: []netip.Addr{nodeIP(nd.i)}, PodCIDRs: nd.published.PodCIDRs, VTEPMAC: routing.VTEPMAC(name)}
	}
	var all []routing.Node
	for _, nd := range c.nodes {
		all = append(all, self(nd))
	}
	for _, nd := range c.nodes {
		d, errs := routing.Compute(routing.Config{Mode: routing.ModeVXLAN, Self: self(nd)}, all)
		if len(errs) > 0 {
			c.t.Fatalf("node-%d: %v", nd.i, errs)
		}
		c.do(nd.ns, func() error {
			// The harness's host-gw routes are not routing's (RouteProtocol):
			// Apply would report them, not take them over.
			for _, other := range c.nodes {
				if other == nd {
					continue
				}
				hostgw := &netlink.Route{Dst: ipnet(podCIDR(other.i)), Gw: nodeIP(other.i).AsSlice()}
				if err := netlink.RouteDel(hostgw); err != nil {
					return fmt.Errorf("deleting the host-gw route to %s: %w", podCIDR(other.i), err)
				}
			}
			return routing.NewReconciler().Apply(d)
		})
	}
}

// serveSink runs a bulk sink in nd's pod on sinkPort: it reads each
// connection to its end, then answers with the number of bytes it read.
func (c *cluster) serveSink(nd *node) {
	c.listen(nd, sinkPort, func(conn net.Conn) {
		buf := make([]byte, 256<<10)
		var n int64
		for {
			k, err := conn.Read(buf)
			n += int64(k)
			if err == io.EOF {
				fmt.Fprintf(conn, "%d\n", n)
				return
			}
			if err != nil {
				return
			}
		}
	})
}

// bulk sends n bytes from namespace ns to pod `to`'s sink on one
// connection and checks the sink's count.
func bulk(ns string, to int, n int64) error {
	var conn net.Conn
	dst := netip.AddrPortFrom(podIP(to), sinkPort).String()
	if err := netnsutil.Do(ns, func() (err error) { conn, err = net.DialTimeout("tcp", dst, 5*time.Second); return err }); err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Minute)) // only stops a hang
	buf := make([]byte, 256<<10)
	for left := n; left > 0; {
		k, err := conn.Write(buf[:min(left, int64(len(buf)))])
		left -= int64(k)
		if err != nil {
			return fmt.Errorf("sending to %s: %w", dst, err)
		}
	}
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		return err
	}
	ans, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return fmt.Errorf("the count of %s: %w", dst, err)
	}
	if got := strings.TrimSpace(ans); got != strconv.FormatInt(n, 10) {
		return fmt.Errorf("%s received %s of the %d bytes sent", dst, got, n)
	}
	return nil
}

// txBytes is the count of bytes sent by link dev in namespace ns.
func (c *cluster) txBytes(ns, dev string) uint64 {
	c.t.Helper()
	var n uint64
	c.do(ns, func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		n = l.Attrs().Statistics.TxBytes
		return nil
	})
	return n
}

// paired runs op over c per iteration, preceded by op over ref unless c is
// ref, and reports c's rate (per units per op) in unit and, against ref,
// ref's rate and the ratio; it returns both rates (c's twice when c is
// ref).
func paired(b *testing.B, ref, c *cluster, unit string, per float64, op func(*cluster) error) (rate, refRate float64) {
	var dt, dref time.Duration
	for b.Loop() {
		if c != ref {
			t0 := time.Now()
			if err := op(ref); err != nil {
				b.Fatalf("hostgw: %v", err)
			}
			dref += time.Since(t0)
		}
		t0 := time.Now()
		if err := op(c); err != nil {
			b.Fatal(err)
		}
		dt += time.Since(t0)
	}
	n := float64(b.N) * per
	rate = n / dt.Seconds()
	b.ReportMetric(rate, unit)
	if c == ref {
		return rate, rate
	}
	refRate = n / dref.Seconds()
	b.ReportMetric(refRate, "hostgw-"+unit)
	b.ReportMetric(rate/refRate, "x-hostgw")
	return rate, refRate
}
