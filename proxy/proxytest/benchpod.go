package proxytest

import (
	"bufio"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"testing"
	"time"

	"github.com/weftnet/weft/internal/netnsutil"
)

// Data-path benchmarks' server pod: a namespace on a veth from the node
// (BenchNodeAddr on the node's end, BenchPodAddr in the pod).
const (
	BenchNodeAddr = "10.244.1.1"
	BenchPodAddr  = "10.244.1.2"
	// BenchRoundBytes is one round of a throughput measure: a connection
	// opened with 'T' is answered one byte per BenchRoundBytes received.
	BenchRoundBytes = 4 << 20
)

// BenchPod starts a server pod: the namespace pod on a veth (link, on the
// node's side) from the node's namespace node ("": the calling process's),
// the node's end holding BenchNodeAddr/24 and routing SvcCIDR to the pod,
// the pod BenchPodAddr. Its server on port 80 answers a connection's first
// byte: '?' with its name and a newline, 'T' with one byte every
// BenchRoundBytes received, any other byte with that byte. Everything goes
// with tb's cleanup.
func BenchPod(tb testing.TB, node, pod, link string) netip.AddrPort {
	tb.Helper()
	path, err := netnsutil.NewNamed(pod)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = netnsutil.Delete(pod) })
	var onNode []string
	if node != "" {
		onNode = []string{"-n", node}
	}
	for _, args := range [][]string{
		append(onNode, "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", path),
		append(onNode, "addr", "add", BenchNodeAddr+"/24", "dev", link),
		append(onNode, "link", "set", link, "up"),
		append(onNode, "route", "add", SvcCIDR, "dev", link),
		{"-n", pod, "addr", "add", BenchPodAddr + "/24", "dev", "eth0"},
		{"-n", pod, "link", "set", "eth0", "up"},
		{"-n", pod, "route", "add", "default", "via", BenchNodeAddr},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			tb.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	tb.Cleanup(func() { _ = exec.Command("ip", append(onNode, "link", "del", link)...).Run() })
	var ln net.Listener
	if err := netnsutil.Do(path, func() (err error) { ln, err = net.Listen("tcp4", BenchPodAddr+":80"); return err }); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serveBenchConn(c, pod)
		}
	}()
	return netip.AddrPortFrom(netip.MustParseAddr(BenchPodAddr), 80)
}

func serveBenchConn(c net.Conn, name string) {
	defer c.Close()
	first := make([]byte, 1)
	if _, err := io.ReadFull(c, first); err != nil {
		return
	}
	switch first[0] {
	case '?':
		_, _ = io.WriteString(c, name+"\n")
	case 'T':
		for {
			if _, err := io.CopyN(io.Discard, c, BenchRoundBytes); err != nil {
				return
			}
			if _, err := c.Write(first); err != nil {
				return
			}
		}
	default:
		_, _ = c.Write(first)
	}
	_, _ = io.Copy(io.Discard, c)
}

// OneConn is one connection of a connection-rate benchmark: connect, a
// byte each way, close with a reset (no TIME_WAIT to run out of ports).
func OneConn(tb testing.TB, addr string) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		tb.Fatal(err)
	}
	tc := c.(*net.TCPConn)
	buf := []byte{'c'}
	if _, err := tc.Write(buf); err != nil {
		tb.Fatal(err)
	}
	if _, err := io.ReadFull(tc, buf); err != nil {
		tb.Fatalf("%s: %v", addr, err)
	}
	_ = tc.SetLinger(0)
	_ = tc.Close()
}

// WhoAnswers asks the server pod at addr its name ('?'), within timeout.
func WhoAnswers(addr string, timeout time.Duration) (string, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte{'?'}); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return line[:max(len(line)-1, 0)], err
}
