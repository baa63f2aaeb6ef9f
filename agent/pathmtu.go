package agent

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/weftnet/weft/internal/pmtu"
)

// DefaultPathMTUPort is where every agent answers path MTU probes (UDP,
// on the node's addresses).
const DefaultPathMTUPort = 9877

// pathMTUParallel is how many nodes a round probes at once.
const pathMTUParallel = 8

// pathMTUInterval is how often the agent measures the paths to the other
// nodes.
const pathMTUInterval = 2 * time.Minute

// runPathMTU answers the other agents' probes on port and, every
// pathMTUInterval, measures the path to each other node's underlay address:
// the largest DF packet that crosses, up to the underlay link's MTU. It is
// exported as weft_path_mtu_bytes{node}, beside what pod packets need on
// the underlay (the pod MTU plus the routing mode's and encryption's
// overhead); a path that carries less is logged, naming the node.
func (a *Agent) runPathMTU(ctx context.Context, port int) error {
	pc, err := net.ListenPacket("udp", ":"+strconv.Itoa(port))
	if err != nil {
		return fmt.Errorf("path MTU responder: %w", err)
	}
	go func() {
		<-ctx.Done()
		pc.Close()
	}()
	go func() {
		if err := pmtu.Serve(pc); err != nil {
			a.opts.Log.Error("path MTU responder stopped", "err", err)
		}
	}()
	timer := time.NewTimer(10 * time.Second) // the first round once peers had time to start
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		a.measurePaths(ctx, port)
		timer.Reset(pathMTUInterval)
	}
}

func (a *Agent) measurePaths(ctx context.Context, port int) {
	self, err := a.nodes.Get(a.opts.NodeName)
	if err != nil {
		return
	}
	me, _ := RoutingNode(self)
	underlay, ok := underlayAddr(me)
	if !ok {
		return
	}
	link, err := linkWithAddr(underlay)
	if err != nil {
		a.opts.Log.Warn("path MTU: the underlay link", "err", err)
		return
	}
	linkMTU := link.Attrs().MTU
	pods, err := a.mtu(me)
	if err != nil {
		return
	}
	needed := pods + Overhead(a.opts.Routing, a.opts.Encryption.Mode, underlay.Is6())
	a.metrics.pathMTUNeeded.Set(float64(needed))
	all, err := a.nodes.List(labels.Everything())
	if err != nil {
		return
	}
	// A few nodes at a time: one that does not answer costs its probes'
	// waits (about 2 s), which the others need not queue behind.
	var mu sync.Mutex
	measured := map[string]bool{}
	var wg sync.WaitGroup
	slots := make(chan struct{}, pathMTUParallel)
	for _, n := range all {
		rn, _ := RoutingNode(n)
		peer, ok := sameFamilyAddr(rn.InternalIPs, underlay.Is4())
		if n.Name == a.opts.NodeName || !ok {
			continue
		}
		select {
		case <-ctx.Done():
		case slots <- struct{}{}:
			wg.Add(1)
			go func() {
				defer func() { <-slots; wg.Done() }()
				size, err := probePath(ctx, peer, port, linkMTU)
				if err != nil {
					a.opts.Log.Warn("path MTU: no answer from the node", "node", n.Name, "address", peer, "err", err)
					return
				}
				mu.Lock()
				measured[n.Name] = true
				mu.Unlock()
				a.metrics.pathMTU.WithLabelValues(n.Name).Set(float64(size))
				if size < needed {
					a.opts.Log.Warn("path MTU: the path to the node carries fewer bytes than pod packets need: lower --mtu, or fix the underlay",
						"node", n.Name, "pathMTU", size, "needed", needed, "podMTU", pods)
				}
			}()
		}
	}
	wg.Wait()
	a.metrics.dropPathMTU(measured)
}

// sameFamilyAddr is the address of addrs that is IPv4 (v4) or IPv6.
func sameFamilyAddr(addrs []netip.Addr, v4 bool) (netip.Addr, bool) {
	for _, ip := range addrs {
		if ip.Is4() == v4 {
			return ip, true
		}
	}
	return netip.Addr{}, false
}

// probePath is the largest DF packet, up to max, that reaches the agent at
// peer and is answered; an error when not even pmtu.Min is.
func probePath(ctx context.Context, peer netip.Addr, port, max int) (int, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "udp", netip.AddrPortFrom(peer, uint16(port)).String())
	if err != nil {
		return 0, err
	}
	c, err := pmtu.New(conn)
	if err != nil {
		conn.Close()
		return 0, err
	}
	defer c.Close()
	if c.Fits(max) {
		return max, nil
	}
	if size := c.Largest(pmtu.Min, max); size > 0 {
		return size, nil
	}
	return 0, fmt.Errorf("not even %d-byte probes are answered", pmtu.Min)
}
