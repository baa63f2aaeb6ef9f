package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/netnsutil"
	nt "github.com/weftnet/weft/policy/netpoltest"
	"github.com/weftnet/weft/proxy/model"
	proxynft "github.com/weftnet/weft/proxy/nftables"
)

// The masquerade bed's address plan: the node (the test's namespace)
// routes between two pod bridges and an outside host.
const (
	masqOutsideNode = "172.18.0.1"
	masqOutside     = "172.18.0.2"
	masqPort        = 8080
)

// TestMasqueradeNFTables: on the nftables data plane, with no iptables
// or ipset tool on PATH, a pod reaching a host outside the cluster CIDRs
// is seen with the node's address, a pod reaching a pod of another bridge
// with its own; --cleanup's path deletes the agent's table and leaves a
// firewall's table and its rules alone.
func TestMasqueradeNFTables(t *testing.T) {
	if !netnsutil.Isolated() {
		t.Skip("kernel test: needs root to run in a private network namespace")
	}
	nftOnlyPath(t)
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	pod1 := masqNS(t, "masq-pod1", "mbr0", "10.244.0.1/24", "10.244.0.2/24")
	pod2 := masqNS(t, "masq-pod2", "mbr1", "10.244.1.1/24", "10.244.1.2/24")
	outside := masqNS(t, "masq-out", "", masqOutsideNode+"/24", masqOutside+"/24")
	seen := serveRemoteAddr(t, outside)
	seen2 := serveRemoteAddr(t, pod2)
	firewall := []string{"add table inet filter", "add chain inet filter forward { type filter hook forward priority 0 ; policy accept ; }",
		"add rule inet filter forward counter"}
	for _, cmd := range firewall {
		if out, err := exec.Command("nft", strings.Fields(cmd)...).CombinedOutput(); err != nil {
			t.Fatalf("nft %s: %v: %s", cmd, err, out)
		}
	}
	a := New(nil, Options{NodeName: "node1", Dataplane: DataplaneNFTables, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})

	if got := seen(pod1, masqOutside); got != "10.244.0.2" {
		t.Fatalf("before the agent's rules the outside host saw %q, want the pod's address", got)
	}
	if err := a.ensureMasquerade(); err != nil {
		t.Fatal(err)
	}
	if err := a.ensureMasquerade(); err != nil { // a resync rewrites it in place
		t.Fatal(err)
	}
	if got := seen(pod1, masqOutside); got != masqOutsideNode {
		t.Errorf("a pod leaving the cluster was seen as %q, want the node's %s", got, masqOutsideNode)
	}
	if got := seen2(pod1, "10.244.1.2"); got != "10.244.0.2" {
		t.Errorf("a pod reaching a pod was seen as %q, want its own 10.244.0.2", got)
	}
	if err := a.Cleanup(); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("nft", "list", "ruleset").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list ruleset: %v: %s", err, out)
	}
	if strings.Contains(string(out), AgentTable) || !strings.Contains(string(out), "table inet filter") || !strings.Contains(string(out), "counter packets") {
		t.Fatalf("after cleanup, want the firewall's table alone:\n%s", out)
	}
	if got := seen(pod1, masqOutside); got != "10.244.0.2" {
		t.Errorf("after cleanup the outside host saw %q, want the pod's address", got)
	}
}

// masqNS makes a namespace with eth0 at addr, whose node end has
// nodeAddr: on a new bridge br (a pod), or straight on the veth (br "").
func masqNS(t *testing.T, name, br, nodeAddr, addr string) string {
	t.Helper()
	path, err := netnsutil.NewNamed(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netnsutil.Delete(name) })
	host := "h" + name
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: host}, PeerName: "eth0"}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(veth) })
	hl, _ := netlink.LinkByName(host)
	nodeLink := hl
	if br != "" {
		bridge := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: br}}
		if err := netlink.LinkAdd(bridge); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = netlink.LinkDel(bridge) })
		if err := netlink.LinkSetMaster(hl, bridge); err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetUp(bridge); err != nil {
			t.Fatal(err)
		}
		nodeLink = bridge
	}
	na, _ := netlink.ParseAddr(nodeAddr)
	if err := netlink.AddrAdd(nodeLink, na); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(hl); err != nil {
		t.Fatal(err)
	}
	peer, _ := netlink.LinkByName("eth0")
	h, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := netlink.LinkSetNsFd(peer, int(h)); err != nil {
		t.Fatal(err)
	}
	err = netnsutil.Do(path, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		a, _ := netlink.ParseAddr(addr)
		a.Flags = unix.IFA_F_NODAD
		if err := netlink.AddrAdd(l, a); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: na.IP})
	})
	if err != nil {
		t.Fatalf("namespace %s: %v", name, err)
	}
	return path
}

// serveRemoteAddr serves, in the namespace at path, TCP connections on
// masqPort with the address each comes from; the returned function
// connects from the namespace at from to addr and returns what it was
// told ("" on failure).
func serveRemoteAddr(t *testing.T, path string) func(from, addr string) string {
	t.Helper()
	err := netnsutil.Do(path, func() error {
		ln, err := net.Listen("tcp", fmt.Sprintf(":%d", masqPort))
		if err != nil {
			return err
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				_, _ = io.WriteString(c, c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap().String())
				c.Close()
			}
		}()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return func(from, addr string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := netnsutil.Dialer(from, nil)(ctx, "tcp", net.JoinHostPort(addr, fmt.Sprint(masqPort)))
		if err != nil {
			t.Logf("connecting to %s: %v", addr, err)
			return ""
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		b, _ := io.ReadAll(c)
		return string(b)
	}
}

// TestCleanupNFTables: on the nftables data plane, with no iptables or
// ipset tool on PATH, the proxy, the policy controller (a whole sync with
// the source check and the ready sets) and the agent program their
// tables; what weft-agent --cleanup runs deletes those four tables and
// leaves a firewall's inet and bridge tables, with their rules, alone.
func TestCleanupNFTables(t *testing.T) {
	if !netnsutil.Isolated() {
		t.Skip("kernel test: needs root to run in a private network namespace")
	}
	nftOnlyPath(t)
	for _, cmd := range []string{
		"add table inet filter", "add chain inet filter forward { type filter hook forward priority 0 ; policy accept ; }",
		"add rule inet filter forward counter",
		"add table bridge filter", "add chain bridge filter prerouting { type filter hook prerouting priority 0 ; policy accept ; }",
		"add rule bridge filter prerouting counter",
	} {
		if out, err := exec.Command("nft", strings.Fields(cmd)...).CombinedOutput(); err != nil {
			t.Fatalf("nft %s: %v: %s", cmd, err, out)
		}
	}
	cidrs := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}
	px, err := proxynft.New(proxynft.Config{NodeName: "node1", ClusterCIDRs: cidrs})
	if err != nil {
		t.Fatal(err)
	}
	if err := px.Sync(model.State{}, true); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	pc, err := NewPolicyController(PolicyOptions{NodeName: "node1", Mode: PolicyModeNFTables, IPAMDataDir: t.TempDir(), Log: log})
	if err != nil {
		t.Fatal(err)
	}
	pc.OnNetworkPolicy(nil, nt.Policy("x", "deny", nil, nt.Ingress()))
	if err := pc.sync(); err != nil {
		t.Fatal(err)
	}
	a := New(nil, Options{NodeName: "node1", Dataplane: DataplaneNFTables, ClusterCIDRs: cidrs, Log: log})
	if err := a.ensureMasquerade(); err != nil {
		t.Fatal(err)
	}
	tables := func() string {
		out, err := exec.Command("nft", "list", "tables").CombinedOutput()
		if err != nil {
			t.Fatalf("nft list tables: %v: %s", err, out)
		}
		return string(out)
	}
	for _, want := range []string{"table inet weft\n", "table inet weft-policy", "table bridge weft-policy", "table inet weft-agent"} {
		if !strings.Contains(tables(), want) {
			t.Fatalf("want %q among:\n%s", want, tables())
		}
	}
	if err := errors.Join(a.Cleanup(), pc.Cleanup(), px.Cleanup()); err != nil {
		t.Fatal(err)
	}
	if got := tables(); got != "table inet filter\ntable bridge filter\n" {
		t.Fatalf("after cleanup, want the firewall's tables alone:\n%s", got)
	}
	for _, fam := range []string{"inet", "bridge"} {
		if out, _ := exec.Command("nft", "list", "table", fam, "filter").CombinedOutput(); !strings.Contains(string(out), "counter packets") {
			t.Errorf("the firewall's %s table lost its rule:\n%s", fam, out)
		}
	}
}
