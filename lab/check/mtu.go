package check

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/lab"
	"github.com/weftnet/weft/lab/workload"
)

// The MTU rows send UDP datagrams with DF set whose IP packets are exactly
// the pod MTU (the MTU of the pods' eth0, what weft derived from the
// underlay and every layer in use) to the workload's UDP echo port, across
// every path a pod packet takes between nodes: pod to pod, pod to a
// Service's backend on another node, and from outside through a NodePort
// to a backend on another node than the one addressed. A path that drops
// them (a link narrower than weft assumed) fails its row, which names the
// largest size that still passed.

// echoPort is the workload's UDP echo port.
const echoPort = 81

// podMTU is the MTU of the pod's eth0.
func podMTU(nsPath string) (int, error) {
	var mtu int
	err := netnsutil.Do(nsPath, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		mtu = l.Attrs().MTU
		return nil
	})
	return mtu, err
}

// dfConn is a UDP socket with DF set on every datagram, to one address.
type dfConn struct {
	conn net.Conn
	v6   bool
	seq  int
}

func dialDF(ctx context.Context, dial lab.DialFunc, addr string) (*dfConn, error) {
	conn, err := dial(ctx, "udp", addr)
	if err != nil {
		return nil, err
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		conn.Close()
		return nil, fmt.Errorf("%T has no socket to set DF on", conn)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		conn.Close()
		return nil, err
	}
	host, _, _ := net.SplitHostPort(addr)
	v6 := strings.Contains(host, ":")
	var serr error
	err = raw.Control(func(fd uintptr) {
		if v6 {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO)
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
		}
	})
	if err = errors.Join(err, serr); err != nil {
		conn.Close()
		return nil, fmt.Errorf("setting DF: %w", err)
	}
	return &dfConn{conn: conn, v6: v6}, nil
}

// send sends one datagram whose IP packet is size bytes and returns the
// pod that echoed it; an error if no echo came within wait.
func (c *dfConn) send(size int, wait time.Duration) (string, error) {
	hdr := 28
	if c.v6 {
		hdr = 48
	}
	if size < hdr+16 {
		return "", fmt.Errorf("size %d is below the headers", size)
	}
	c.seq++
	// A size probe: the workload echoes its first line only, so the answer
	// is small and the path is measured in this direction.
	token := fmt.Sprintf("%s%d %d", workload.SizeProbePrefix, c.seq, size)
	payload := []byte(token + "\n" + strings.Repeat("x", size-hdr-len(token)-1))
	if _, err := c.conn.Write(payload); err != nil {
		return "", err // EMSGSIZE: the route's known MTU is smaller
	}
	buf := make([]byte, 65536)
	_ = c.conn.SetReadDeadline(time.Now().Add(wait))
	for {
		n, err := c.conn.Read(buf)
		if err != nil {
			return "", fmt.Errorf("no echo of %d bytes: %w", size, err)
		}
		// The echo is "<pod> saw <client>: <payload>"; an echo of an
		// earlier, late datagram is skipped.
		pod, rest, ok := strings.Cut(string(buf[:n]), " saw ")
		if ok && strings.Contains(rest, token) {
			return pod, nil
		}
	}
}

func (c *dfConn) close() { c.conn.Close() }

// fits sends size up to three times (UDP may lose one).
func (c *dfConn) fits(size int) bool {
	for range 3 {
		if _, err := c.send(size, 300*time.Millisecond); err == nil {
			return true
		}
	}
	return false
}

// largest is the largest size in [low, high) that passes, by bisection (0
// if not even low does).
func (c *dfConn) largest(low, high int) int {
	if !c.fits(low) {
		return 0
	}
	for high-low > 1 {
		mid := (low + high) / 2
		if c.fits(mid) {
			low = mid
		} else {
			high = mid
		}
	}
	return low
}

// minProbe is the smallest size the bisection tries: IPv4's minimum MTU
// that every link must carry (576) is below any pod MTU weft derives.
const minProbe = 576

// mtuResult probes c at mtu and fills r.
func mtuResult(r Result, c *dfConn, mtu int) Result {
	if c.fits(mtu) {
		r.OK, r.Detail = true, fmt.Sprintf("%d-byte DF datagrams (the pod MTU) pass", mtu)
		return r
	}
	if best := c.largest(minProbe, mtu); best > 0 {
		r.Detail = fmt.Sprintf("%d-byte DF datagrams (the pod MTU) are lost on this path; the largest that passed: %d bytes", mtu, best)
	} else {
		r.Detail = fmt.Sprintf("%d-byte DF datagrams (the pod MTU) are lost on this path, and so are %d-byte ones", mtu, minProbe)
	}
	return r
}

// mtuPodRows: every ordered pair of probe pods on different nodes.
func mtuPodRows(ctx context.Context, pods []endpoint) []Result {
	var out []Result
	for _, a := range pods {
		mtu, err := podMTU(a.nsPath)
		for _, b := range pods {
			if a.node.Name == b.node.Name {
				continue
			}
			r := Result{Kind: "MTU: pod to pod, other node", From: a.name, To: b.name}
			if err != nil {
				r.Detail = err.Error()
				out = append(out, r)
				continue
			}
			c, derr := dialDF(ctx, a.dial, net.JoinHostPort(b.ip.String(), fmt.Sprint(echoPort)))
			if derr != nil {
				r.Detail = derr.Error()
				out = append(out, r)
				continue
			}
			out = append(out, mtuResult(r, c, mtu))
			c.close()
		}
	}
	return out
}

// dialRemoteBackend opens DF sockets to a Service address until one's flow
// is balanced to a backend on another node than local (a probe pod's
// name decides), then keeps that socket: its later datagrams take the same
// conntrack entry, so the same backend.
func dialRemoteBackend(ctx context.Context, dial lab.DialFunc, addr string, remote func(pod string) bool) (*dfConn, string, error) {
	var last error
	for range 30 {
		c, err := dialDF(ctx, dial, addr)
		if err != nil {
			return nil, "", err
		}
		pod, err := c.send(minProbe, 500*time.Millisecond)
		if err == nil && remote(pod) {
			return c, pod, nil
		}
		c.close()
		if err == nil {
			err = fmt.Errorf("answered by %s, on the same node", pod)
		}
		last = err
	}
	return nil, "", fmt.Errorf("no flow to a backend on another node: %w", last)
}

// mtuServiceRows: from each probe pod to the Service's UDP port on its
// ClusterIP, and from the external host to each node's UDP NodePort, each
// reaching a backend on another node.
func mtuServiceRows(ctx context.Context, st *lab.State, pods []endpoint, nodes []lab.Member, ext lab.Member, clusterIP string, nodePort int32) []Result {
	nodeOf := map[string]string{}
	for _, p := range pods {
		nodeOf[p.name] = p.node.Name
	}
	mtu, err := podMTU(pods[0].nsPath)
	var out []Result
	probe := func(r Result, dial lab.DialFunc, addr, fromNode string) {
		if err != nil {
			r.Detail = err.Error()
			out = append(out, r)
			return
		}
		c, backend, derr := dialRemoteBackend(ctx, dial, addr, func(pod string) bool { return nodeOf[pod] != "" && nodeOf[pod] != fromNode })
		if derr != nil {
			r.Detail = derr.Error()
			out = append(out, r)
			return
		}
		r.To += " -> " + backend
		out = append(out, mtuResult(r, c, mtu))
		c.close()
	}
	for _, p := range pods {
		probe(Result{Kind: "MTU: pod to ClusterIP, backend on other node", From: p.name, To: "svc/probe udp"},
			p.dial, net.JoinHostPort(clusterIP, fmt.Sprint(echoPort)), p.node.Name)
	}
	for _, n := range nodes {
		probe(Result{Kind: "MTU: external to NodePort, backend on other node", From: "external", To: fmt.Sprintf("%s:%d udp", n.Name, nodePort)},
			st.Dialer(ext.NSPath()), net.JoinHostPort(n.IP.String(), fmt.Sprint(nodePort)), n.Name)
	}
	return out
}
