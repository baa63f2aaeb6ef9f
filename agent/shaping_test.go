package agent

import (
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/weftnet/weft/cni"
	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/topology"
)

// shapingBed is a pod namespace joined to the test's namespace by a veth
// whose host side has a host veth's name; the pod has podAddr, the host
// hostAddr (a /30 between them).
func shapingBed(t *testing.T, container string) (hostVeth, podNS string) {
	t.Helper()
	if !netnsutil.Isolated() {
		t.Skip("kernel test: needs root to run in a private network namespace")
	}
	hostVeth = cni.HostVethName(container, "eth0")
	name := "shape-" + container
	podNS, err := netnsutil.NewNamed(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netnsutil.Delete(name) })
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	run("ip", "link", "add", hostVeth, "type", "veth", "peer", "name", "eth0", "netns", podNS)
	run("ip", "addr", "add", "10.244.9.1/30", "dev", hostVeth)
	run("ip", "link", "set", hostVeth, "up")
	run("ip", "-n", name, "addr", "add", "10.244.9.2/30", "dev", "eth0")
	run("ip", "-n", name, "link", "set", "eth0", "up")
	return hostVeth, podNS
}

// ifbTxPackets is how many packets the IFB passed back to the stack.
func ifbTxPackets(t *testing.T, name string) uint64 {
	t.Helper()
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l.Attrs().Statistics.TxPackets
}

// sendFromPod opens a TCP connection from the pod to the host and writes
// a little.
func sendFromPod(t *testing.T, podNS string) {
	t.Helper()
	ln, err := net.Listen("tcp", "10.244.9.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			buf := make([]byte, 4096)
			for {
				if _, err := c.Read(buf); err != nil {
					c.Close()
					return
				}
			}
		}
	}()
	err = netnsutil.Do(podNS, func() error {
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(make([]byte, 64<<10))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The shaper puts both TBFs and the redirect in place, traffic from the
// pod goes through the IFB, a repeated apply changes nothing, and an
// apply without the shape removes all of it.
func TestShaperKernel(t *testing.T) {
	hostVeth, podNS := shapingBed(t, "c-shaped")
	sh := topology.NewShape("x/shaped", hostVeth, 40)
	s := newShaper()
	if missing, err := s.apply([]topology.Shape{sh}, true); err != nil || missing != 0 {
		t.Fatalf("apply: missing %d, %v", missing, err)
	}
	veth, err := netlink.LinkByName(hostVeth)
	if err != nil {
		t.Fatal(err)
	}
	ifb, err := netlink.LinkByName(sh.IFB)
	if err != nil {
		t.Fatalf("no IFB %s: %v", sh.IFB, err)
	}
	for _, l := range []netlink.Link{veth, ifb} {
		list, err := qdiscs(l.Attrs().Index)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, q := range list {
			if tbf, ok := q.(*netlink.Tbf); ok && tbf.Rate == 5_000_000 && tbf.Handle == netlink.MakeHandle(shapeHandleMajor, 0) {
				found = true
			}
		}
		if !found {
			t.Fatalf("no 40 Mbit/s TBF at the root of %s: %v", l.Attrs().Name, list)
		}
	}
	before := ifbTxPackets(t, sh.IFB)
	sendFromPod(t, podNS)
	if after := ifbTxPackets(t, sh.IFB); after <= before {
		t.Fatalf("traffic from the pod did not pass the IFB (%d packets before, %d after)", before, after)
	}

	out, _ := exec.Command("tc", "filter", "show", "dev", hostVeth, "ingress").CombinedOutput()
	if _, err := s.apply([]topology.Shape{sh}, true); err != nil {
		t.Fatal(err)
	}
	again, _ := exec.Command("tc", "filter", "show", "dev", hostVeth, "ingress").CombinedOutput()
	if string(out) != string(again) || !strings.Contains(string(out), "mirred") {
		t.Fatalf("a second apply changed the redirect:\n%s\nthen\n%s", out, again)
	}

	if _, err := s.apply(nil, true); err != nil {
		t.Fatal(err)
	}
	if _, err := netlink.LinkByName(sh.IFB); err == nil {
		t.Fatalf("IFB %s left after the shape went", sh.IFB)
	}
	list, _ := qdiscs(veth.Attrs().Index)
	for _, q := range list {
		if _, ok := q.(*netlink.Tbf); ok {
			t.Fatalf("TBF left on %s: %v", hostVeth, q)
		}
	}
	if out, _ := exec.Command("tc", "filter", "show", "dev", hostVeth, "ingress").CombinedOutput(); strings.Contains(string(out), "mirred") {
		t.Fatalf("redirect left on %s:\n%s", hostVeth, out)
	}
}

// The render: TBFs at the root of the veth (to the pod) and of the IFB
// (from the pod), a redirect of everything entering the veth to the IFB.
func TestRenderShape(t *testing.T) {
	sh := topology.NewShape("x/p", cni.HostVethName("c", "eth0"), 40)
	tc := renderShape(sh, 7, 9)
	for _, c := range []struct {
		q    *netlink.Tbf
		link int
	}{{tc.toPod, 7}, {tc.fromPod, 9}} {
		if c.q.LinkIndex != c.link || c.q.Parent != netlink.HANDLE_ROOT || c.q.Handle != netlink.MakeHandle(shapeHandleMajor, 0) ||
			c.q.Rate != 5_000_000 || c.q.Limit != sh.Limit || c.q.Buffer != netlink.Xmittime(5_000_000, sh.Burst) {
			t.Errorf("TBF on link %d: %+v", c.link, c.q)
		}
	}
	if tc.clsact.LinkIndex != 7 || tc.clsact.Parent != netlink.HANDLE_CLSACT {
		t.Errorf("clsact: %+v", tc.clsact)
	}
	r := tc.redirect
	if r.LinkIndex != 7 || r.Parent != netlink.HANDLE_MIN_INGRESS || r.Priority != redirectPriority || len(r.Sel.Keys) != 1 || r.Sel.Keys[0].Mask != 0 {
		t.Errorf("redirect: %+v %+v", r, r.Sel)
	}
	if m, ok := r.Actions[0].(*netlink.MirredAction); len(r.Actions) != 1 || !ok || m.Ifindex != 9 || m.MirredAction != netlink.TCA_EGRESS_REDIR {
		t.Errorf("redirect actions: %+v", r.Actions)
	}
}
