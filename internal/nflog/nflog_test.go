package nflog

import (
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/netnsutil"
)

func TestMain(m *testing.M) { os.Exit(netnsutil.RunTests(m)) }

// TestReadsLoggedPackets: a UDP datagram to 127.0.0.9:4242 that an
// nftables rule logs to group 7 arrives with the rule's prefix, and its
// flow reads back; a datagram the rule does not log does not.
func TestReadsLoggedPackets(t *testing.T) {
	if testing.Short() || !netnsutil.Isolated() {
		t.Skip("kernel test: needs root (private network namespace), not -short")
	}
	for _, args := range [][]string{{"link", "set", "lo", "up"}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	for _, args := range [][]string{
		{"add", "table", "inet", "nflogtest"},
		{"add", "chain", "inet", "nflogtest", "out", "{ type filter hook output priority 0; }"},
		{"add", "rule", "inet", "nflogtest", "out", "ip", "daddr", "127.0.0.9", "udp", "dport", "4242", "log", "prefix", `"weft test"`, "group", "7"},
	} {
		if out, err := exec.Command("nft", args...).CombinedOutput(); err != nil {
			t.Fatalf("nft %v: %v: %s", args, err, out)
		}
	}
	r, err := Open(7)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got := make(chan []Packet, 1)
	go func() {
		ps, err := r.Read()
		if err != nil {
			t.Error(err)
		}
		got <- ps
	}()
	for _, port := range []int{4243, 4242} { // the first is not logged
		c, err := net.Dial("udp", net.JoinHostPort("127.0.0.9", strconv.Itoa(port)))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write([]byte("hello"))
		c.Close()
	}
	select {
	case ps := <-got:
		if len(ps) != 1 || ps[0].Prefix != "weft test" {
			t.Fatalf("read %+v, want one packet with prefix %q", ps, "weft test")
		}
		f, ok := ParseFlow(ps[0].Payload)
		want := Flow{Src: netip.MustParseAddr("127.0.0.1"), Dst: netip.MustParseAddr("127.0.0.9"), Protocol: unix.IPPROTO_UDP, Port: 4242}
		if !ok || f != want {
			t.Fatalf("flow %+v (%v), want %+v", f, ok, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("nothing read")
	}
}

// TestParseFlow reads an IPv6 TCP packet, an IPv4 ICMP one and a later
// IPv4 fragment (no port).
func TestParseFlow(t *testing.T) {
	v6 := make([]byte, 60)
	v6[0], v6[6] = 6<<4, unix.IPPROTO_TCP
	copy(v6[8:], netip.MustParseAddr("fd00::1").AsSlice())
	copy(v6[24:], netip.MustParseAddr("fd00::2").AsSlice())
	v6[42], v6[43] = 0x1f, 0x90 // 8080
	v4 := make([]byte, 28)
	v4[0], v4[9] = 0x45, unix.IPPROTO_ICMP
	copy(v4[12:], []byte{10, 0, 0, 1})
	copy(v4[16:], []byte{10, 0, 0, 2})
	frag := append([]byte(nil), v4...)
	frag[9], frag[7], frag[22], frag[23] = unix.IPPROTO_UDP, 0x10, 0, 53
	for _, tc := range []struct {
		pkt  []byte
		want Flow
	}{
		{v6, Flow{netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2"), unix.IPPROTO_TCP, 8080}},
		{v4, Flow{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), unix.IPPROTO_ICMP, 0}},
		{frag, Flow{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), unix.IPPROTO_UDP, 0}},
	} {
		if got, ok := ParseFlow(tc.pkt); !ok || got != tc.want {
			t.Errorf("ParseFlow = %+v %v, want %+v", got, ok, tc.want)
		}
	}
	if _, ok := ParseFlow([]byte{0x45}); ok {
		t.Error("a truncated packet parsed")
	}
}

// TestCloseWakesRead: Close ends a Read that waits for packets.
func TestCloseWakesRead(t *testing.T) {
	if testing.Short() || !netnsutil.Isolated() {
		t.Skip("kernel test: needs root (private network namespace), not -short")
	}
	r, err := Open(8)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := r.Read()
		done <- err
	}()
	time.Sleep(100 * time.Millisecond) // let the Read block first
	r.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Read returned no error after Close")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake the Read")
	}
}
