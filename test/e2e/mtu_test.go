package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/lab"
	"github.com/weftnet/weft/lab/check"
)

// TestMTUCheckFindsANarrowLink narrows node2's link on the underlay to
// 1400 bytes while every interface still says 1500, as on a cloud whose
// path is smaller than its interfaces: the nodes' own traffic is told (a
// route MTU, as a cloud's DHCP or MSS clamping would), pod traffic is not,
// and the bridge drops what is too large without a word. weftctl check's
// MTU rows must fail on every path through node2, naming the largest size
// that passed (1400), and every other row pass; node1's agent exports the
// path MTU it measured to node2.
func TestMTUCheckFindsANarrowLink(t *testing.T) {
	c := up(t, 2, "hostgw")
	const narrow = 1400
	node2 := c.node("node2")
	inNS := func(path string, fn func() error) {
		t.Helper()
		if err := netnsutil.Do(path, fn); err != nil {
			t.Fatal(err)
		}
	}
	inNS(netnsutil.RunDir+"/"+lab.UnderlayNS, func() error {
		l, err := netlink.LinkByName("ul-" + node2.Name)
		if err != nil {
			return err
		}
		return netlink.LinkSetMTU(l, narrow)
	})
	for _, m := range c.state.Members {
		peers := []netip.Addr{node2.IP}
		if m.Name == node2.Name {
			peers = nil
			for _, o := range c.state.Members {
				if o.Name != m.Name {
					peers = append(peers, o.IP)
				}
			}
		}
		inNS(m.NSPath(), func() error {
			eth0, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			for _, p := range peers {
				r := &netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: &net.IPNet{IP: p.AsSlice(), Mask: net.CIDRMask(32, 32)},
					Scope: netlink.SCOPE_LINK, MTU: narrow}
				if err := netlink.RouteReplace(r); err != nil {
					return err
				}
			}
			return nil
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	results, err := check.Run(ctx, c.state, c.client, false)
	if err != nil {
		t.Fatalf("check: %v", err)
	}
	// Two nodes: every path between them crosses node2's link, the
	// NodePort's of node1 too (its backend on node2).
	mtuRows := 0
	for _, r := range results {
		if !strings.HasPrefix(r.Kind, "MTU: ") {
			if !r.OK {
				t.Errorf("check %s %s -> %s failed, and only MTU rows should: %s", r.Kind, r.From, r.To, r.Detail)
			}
			continue
		}
		mtuRows++
		t.Logf("%s %s -> %s: ok %v: %s", r.Kind, r.From, r.To, r.OK, r.Detail)
		// A veth takes in 4 bytes over its MTU (room for a VLAN tag), so
		// from node2 up to 1404 bytes pass.
		var largest int
		_, after, _ := strings.Cut(r.Detail, "the largest that passed: ")
		if _, err := fmt.Sscanf(after, "%d bytes", &largest); r.OK || err != nil || largest < narrow || largest > narrow+4 {
			t.Errorf("%s %s -> %s: %q, want a failure naming %d bytes (up to 4 more) as the largest that passed", r.Kind, r.From, r.To, r.Detail, narrow)
		}
	}
	if mtuRows == 0 {
		t.Fatal("check ran no MTU row")
	}

	// node1's agent measures the path to node2's agent: a restart measures
	// at once rather than at the next round.
	if err := lab.Restart(c.dir, "node1-agent"); err != nil {
		t.Fatal(err)
	}
	var got, needed float64
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(time.Second) {
		m, err := agentMetrics(c.node("node1"))
		if err != nil {
			continue // restarting
		}
		got, needed = m[`weft_path_mtu_bytes{node="node2"}`], m["weft_path_mtu_needed_bytes"]
		if got != 0 {
			break
		}
	}
	if got != narrow || needed != 1500 {
		t.Fatalf("node1's agent measured a path MTU of %v to node2 (want %d) and says pod packets need %v (want 1500, host-gw)", got, narrow, needed)
	}
}
