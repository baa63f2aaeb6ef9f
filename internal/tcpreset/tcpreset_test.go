package tcpreset

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/netnsutil"
)

func TestMain(m *testing.M) { os.Exit(netnsutil.RunTests(m)) }

// The test process is a node routing between a client (10.1.0.2, IPv6
// fd00:1::2) and a server (10.2.0.2, fd00:2::2), each in its own network
// namespace.
func network(t *testing.T) (client, server string) {
	t.Helper()
	if testing.Short() || !netnsutil.Isolated() {
		t.Skip("kernel test: needs root (private network namespace), not -short")
	}
	ns := map[string]string{}
	for _, name := range []string{"client", "server"} {
		path, err := netnsutil.NewNamed("tcpreset-" + name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = netnsutil.Delete("tcpreset-" + name) })
		ns[name] = path
	}
	t.Cleanup(func() {
		for _, l := range []string{"to-client", "to-server"} {
			_ = exec.Command("ip", "link", "del", l).Run()
		}
	})
	for _, args := range [][]string{
		{"link", "add", "to-client", "type", "veth", "peer", "name", "eth0", "netns", ns["client"]},
		{"link", "add", "to-server", "type", "veth", "peer", "name", "eth0", "netns", ns["server"]},
		{"addr", "add", "10.1.0.1/24", "dev", "to-client"},
		{"addr", "add", "10.2.0.1/24", "dev", "to-server"},
		{"-6", "addr", "add", "fd00:1::1/64", "dev", "to-client", "nodad"},
		{"-6", "addr", "add", "fd00:2::1/64", "dev", "to-server", "nodad"},
		{"link", "set", "to-client", "up"},
		{"link", "set", "to-server", "up"},
		{"-n", "tcpreset-client", "addr", "add", "10.1.0.2/24", "dev", "eth0"},
		{"-n", "tcpreset-server", "addr", "add", "10.2.0.2/24", "dev", "eth0"},
		{"-n", "tcpreset-client", "-6", "addr", "add", "fd00:1::2/64", "dev", "eth0", "nodad"},
		{"-n", "tcpreset-server", "-6", "addr", "add", "fd00:2::2/64", "dev", "eth0", "nodad"},
		{"-n", "tcpreset-client", "link", "set", "eth0", "up"},
		{"-n", "tcpreset-server", "link", "set", "eth0", "up"},
		{"-n", "tcpreset-client", "route", "add", "default", "via", "10.1.0.1"},
		{"-n", "tcpreset-server", "route", "add", "default", "via", "10.2.0.1"},
		{"-n", "tcpreset-client", "-6", "route", "add", "default", "via", "fd00:1::1"},
		{"-n", "tcpreset-server", "-6", "route", "add", "default", "via", "fd00:2::1"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	for _, f := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
		if err := os.WriteFile(f, []byte("1"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return ns["client"], ns["server"]
}

// connect opens a connection from the client to the server's port and
// returns the client's end once the server has accepted it.
func connect(t *testing.T, clientNS, serverNS, serverAddr string) net.Conn {
	t.Helper()
	var ln net.Listener
	if err := netnsutil.Do(serverNS, func() (err error) { ln, err = net.Listen("tcp", serverAddr); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			t.Cleanup(func() { c.Close() })
		}
		accepted <- c
	}()
	var c net.Conn
	if err := netnsutil.Do(clientNS, func() (err error) { c, err = net.DialTimeout("tcp", serverAddr, 2*time.Second); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if <-accepted == nil {
		t.Fatal("the server accepted nothing")
	}
	return c
}

// TestResetReachesWaitingClient: a client blocked reading from a server
// that vanished (its link gone, no FIN, no reset) gets ECONNRESET from
// Reset, run on the node between them; a flow with no such connection at
// the client is left unanswered and changes nothing.
func TestResetReachesWaitingClient(t *testing.T) {
	clientNS, serverNS := network(t)
	for _, tc := range []struct{ name, server string }{{"IPv4", "10.2.0.2:8080"}, {"IPv6", "[fd00:2::2]:8080"}} {
		t.Run(tc.name, func(t *testing.T) {
			c := connect(t, clientNS, serverNS, tc.server)
			other := connect(t, clientNS, serverNS, netip.AddrPortFrom(netip.MustParseAddrPort(tc.server).Addr(), 8081).String())
			// The server is cut off: nothing reaches it any more.
			srv := netip.MustParseAddrPort(tc.server).Addr()
			blackhole := []string{"route", "add", "blackhole", netip.PrefixFrom(srv, srv.BitLen()).String()}
			if out, err := exec.Command("ip", blackhole...).CombinedOutput(); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			blackhole[1] = "del"
			t.Cleanup(func() { _ = exec.Command("ip", blackhole...).Run() })
			read := make(chan error, 1)
			go func() {
				_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
				_, err := c.Read(make([]byte, 1))
				read <- err
			}()
			flow := Flow{Client: netip.MustParseAddrPort(c.LocalAddr().String()), Server: netip.MustParseAddrPort(tc.server)}
			stray := Flow{Client: netip.AddrPortFrom(flow.Client.Addr(), 9), Server: flow.Server}
			res := Reset([]Flow{flow, stray}, 2*time.Second)
			if res.Err != nil {
				t.Fatal(res.Err)
			}
			if len(res.Reset) != 1 || res.Reset[0] != flow || len(res.Unanswered) != 1 || res.Unanswered[0] != stray {
				t.Fatalf("reset %v, unanswered %v, unreachable %v; want %v reset, %v unanswered", res.Reset, res.Unanswered, res.Unreachable, flow, stray)
			}
			select {
			case err := <-read:
				if !errors.Is(err, syscall.ECONNRESET) {
					t.Fatalf("the client's read ended with %v, want ECONNRESET", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the client's read still waits")
			}
			// The client's other connection to the server is untouched.
			_ = other.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			if _, err := other.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("the other connection: %v, want it still open (read deadline)", err)
			}
		})
	}
}

// TestClientOnNode: a client on the node itself, blocked reading from a
// server that sends nothing, is not behind a device: its socket is aborted
// in place (ECONNABORTED), over IPv4 and IPv6; a flow with no socket is
// left unanswered, and the client's other connection is untouched.
func TestClientOnNode(t *testing.T) {
	if testing.Short() || !netnsutil.Isolated() {
		t.Skip("kernel test: needs root (private network namespace), not -short")
	}
	if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	const self = "/proc/self/ns/net" // the test process's own namespace
	for _, tc := range []struct{ name, server string }{{"IPv4", "127.0.0.1:8080"}, {"IPv6", "[::1]:8080"}} {
		t.Run(tc.name, func(t *testing.T) {
			c := connect(t, self, self, tc.server)
			server := netip.MustParseAddrPort(tc.server)
			other := connect(t, self, self, netip.AddrPortFrom(server.Addr(), 8081).String())
			read := make(chan error, 1)
			go func() {
				_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
				_, err := c.Read(make([]byte, 1))
				read <- err
			}()
			flow := Flow{Client: netip.MustParseAddrPort(c.LocalAddr().String()), Server: server}
			stray := Flow{Client: netip.AddrPortFrom(flow.Client.Addr(), 9), Server: server}
			res := Reset([]Flow{flow, stray}, time.Second)
			if res.Err != nil {
				t.Fatal(res.Err)
			}
			if len(res.Aborted) != 1 || res.Aborted[0] != flow || len(res.Unanswered) != 1 || res.Unanswered[0] != stray || len(res.Reset)+len(res.Unreachable) > 0 {
				t.Fatalf("%+v, want %v aborted and %v unanswered", res, flow, stray)
			}
			select {
			case err := <-read:
				if !errors.Is(err, syscall.ECONNABORTED) {
					t.Fatalf("the client's read ended with %v, want ECONNABORTED", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the client's read still waits")
			}
			_ = other.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			if _, err := other.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("the other connection: %v, want it still open (read deadline)", err)
			}
		})
	}
}

// TestCaptureFilter runs the capture filter on crafted packets: TCP to a
// listed port passes, from any family; another port, another protocol, a
// fragment and a packet the node sends do not; without ports any TCP
// segment passes.
func TestCaptureFilter(t *testing.T) {
	v4 := func(proto byte, dport uint16, frag bool) []byte {
		b := make([]byte, 40)
		b[0], b[9] = 0x45, proto
		if frag {
			b[7] = 8 // fragment offset 8
		}
		b[22], b[23] = byte(dport>>8), byte(dport)
		return b
	}
	v6 := func(proto byte, dport uint16) []byte {
		b := make([]byte, 60)
		b[0], b[6] = 0x60, proto
		b[42], b[43] = byte(dport>>8), byte(dport)
		return b
	}
	for _, tc := range []struct {
		name     string
		ports    []uint16
		pkt      []byte
		proto    uint16
		outgoing bool
		want     bool
	}{
		{"IPv4 TCP to a port", []uint16{80, 8080}, v4(6, 8080, false), 0x0800, false, true},
		{"IPv4 TCP to the first port", []uint16{80, 8080}, v4(6, 80, false), 0x0800, false, true},
		{"IPv4 TCP to another port", []uint16{80, 8080}, v4(6, 81, false), 0x0800, false, false},
		{"IPv4 UDP", []uint16{80}, v4(17, 80, false), 0x0800, false, false},
		{"IPv4 fragment", []uint16{80}, v4(6, 80, true), 0x0800, false, false},
		{"IPv6 TCP to a port", []uint16{80, 8080}, v6(6, 8080), 0x86dd, false, true},
		{"IPv6 TCP to another port", []uint16{80}, v6(6, 81), 0x86dd, false, false},
		{"IPv6 UDP", []uint16{80}, v6(17, 80), 0x86dd, false, false},
		{"sent by the node", []uint16{80}, v4(6, 80, false), 0x0800, true, false},
		{"ARP", []uint16{80}, v4(6, 80, false), 0x0806, false, false},
		{"no ports: any TCP", nil, v4(6, 12345, false), 0x0800, false, true},
		{"no ports: not UDP", nil, v6(17, 12345), 0x86dd, false, false},
	} {
		got := runFilter(t, captureFilter(tc.ports), tc.pkt, tc.proto, tc.outgoing)
		if got != tc.want {
			t.Errorf("%s: passed %v, want %v", tc.name, got, tc.want)
		}
	}
}

// runFilter runs prog on pkt with the packet type and protocol its
// extensions read (x/net/bpf's VM knows none): they are replaced by
// loads of the given values.
func runFilter(t *testing.T, prog []bpf.Instruction, pkt []byte, proto uint16, outgoing bool) bool {
	t.Helper()
	fixed := make([]bpf.Instruction, len(prog))
	for i, in := range prog {
		switch e, ok := in.(bpf.LoadExtension); {
		case ok && e.Num == bpf.ExtType:
			v := uint32(unix.PACKET_HOST)
			if outgoing {
				v = unix.PACKET_OUTGOING
			}
			fixed[i] = bpf.LoadConstant{Dst: bpf.RegA, Val: v}
		case ok && e.Num == bpf.ExtProto:
			fixed[i] = bpf.LoadConstant{Dst: bpf.RegA, Val: uint32(proto)}
		default:
			fixed[i] = in
		}
	}
	vm, err := bpf.NewVM(fixed)
	if err != nil {
		t.Fatal(err)
	}
	n, err := vm.Run(pkt)
	if err != nil {
		t.Fatal(err)
	}
	return n > 0
}
