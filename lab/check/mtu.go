package check

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/internal/pmtu"
	"github.com/weftnet/weft/lab"
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

// dialDF opens a DF socket to addr over dial.
func dialDF(ctx context.Context, dial lab.DialFunc, addr string) (*pmtu.Conn, error) {
	conn, err := dial(ctx, "udp", addr)
	if err != nil {
		return nil, err
	}
	c, err := pmtu.New(conn)
	if err != nil {
		conn.Close()
	}
	return c, err
}

// answeredBy is the pod that echoed a probe ("<pod> saw <client>: ...").
func answeredBy(answer string) string {
	pod, _, _ := strings.Cut(answer, " saw ")
	return pod
}

// mtuResult probes c at mtu and fills r.
func mtuResult(r Result, c *pmtu.Conn, mtu int) Result {
	if c.Fits(mtu) {
		r.OK, r.Detail = true, fmt.Sprintf("%d-byte DF datagrams (the pod MTU) pass", mtu)
		return r
	}
	if best := c.Largest(pmtu.Min, mtu); best > 0 {
		r.Detail = fmt.Sprintf("%d-byte DF datagrams (the pod MTU) are lost on this path; the largest that passed: %d bytes", mtu, best)
	} else {
		r.Detail = fmt.Sprintf("%d-byte DF datagrams (the pod MTU) are lost on this path, and so are %d-byte ones", mtu, pmtu.Min)
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
			c.Close()
		}
	}
	return out
}

// dialRemoteBackend opens DF sockets to a Service address until one's flow
// is balanced to a backend on another node than local (a probe pod's
// name decides), then keeps that socket: its later datagrams take the same
// conntrack entry, so the same backend.
func dialRemoteBackend(ctx context.Context, dial lab.DialFunc, addr string, remote func(pod string) bool) (*pmtu.Conn, string, error) {
	var last error
	for range 30 {
		c, err := dialDF(ctx, dial, addr)
		if err != nil {
			return nil, "", err
		}
		answer, err := c.Send(pmtu.Min, 500*time.Millisecond)
		pod := answeredBy(answer)
		if err == nil && remote(pod) {
			return c, pod, nil
		}
		c.Close()
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
		c.Close()
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
