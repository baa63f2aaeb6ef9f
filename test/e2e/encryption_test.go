package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/agent"
	"github.com/weftnet/weft/internal/capture"
	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/lab"
	"github.com/weftnet/weft/routing"
	"github.com/weftnet/weft/routing/wireguard"
)

// TestWireGuardEncryption brings up a 3-node VXLAN lab with --encryption
// wireguard (userspace here: this kernel has no WireGuard) and shows, from
// a capture on node1's underlay link, that pod traffic crosses only inside
// the tunnel: weftctl check passes with no pod-addressed packet, no VXLAN
// packet and no payload in clear. Then an agent restart and a rotation on
// request each change the node's key while a cross-node stream goes on.
func TestWireGuardEncryption(t *testing.T) {
	c := upOptions(t, lab.Options{Nodes: 3, Routing: "vxlan", Encryption: "wireguard"})
	ctx := context.Background()
	keys := publishedKeys(t, c)
	for _, n := range []string{"node1", "node2"} {
		if keys[n] == "" {
			t.Fatalf("%s published no WireGuard key", n)
		}
	}
	uplink := underlayLink(t, c.node("node1"))
	cp, err := capture.Start(c.node("node1").NSPath(), uplink)
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Stop()

	c.mustCheck(t)
	pods := map[string]*corev1.Pod{}
	for _, node := range []string{"node1", "node2"} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "wg-" + node},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "w", Image: lab.WorkloadImage}}}}
		if _, err := c.client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pods[node] = waitRunning(t, c, "default", p.Name)
	}
	s := openStream(t, c, "pod-to-pod stream", c.podNS(t, pods["node1"]), net.JoinHostPort(pods["node2"].Status.PodIP, "81"))
	const secret = "weft-wireguard-secret-payload"
	s.exchange(t, secret)

	frames := cp.Stop()
	clear, tunnel := classify(frames)
	if len(clear) > 0 || capture.Contains(frames, []byte(secret)) || tunnel == 0 {
		t.Fatalf("node1's underlay during check and the stream: %d tunnel packets, payload seen %v, in clear: %v",
			tunnel, capture.Contains(frames, []byte(secret)), clear)
	}
	t.Logf("node1's underlay: %d frames, %d WireGuard packets, none with a pod address or the payload", len(frames), tunnel)

	// An agent restart makes a new key; the stream goes on.
	worst := s.during(t, 3*time.Second, func() {
		if err := lab.Restart(c.dir, "node2-agent"); err != nil {
			t.Fatal(err)
		}
		waitKeyChange(t, c, "node2", keys["node2"])
	})
	t.Logf("node2's agent restarted with a new key: the stream stalled at most %v", worst)

	// A rotation on request does the same without a restart.
	keys = publishedKeys(t, c)
	worst = s.during(t, 3*time.Second, func() {
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{agent.RotateAnnotation: "1"}}})
		if _, err := c.client.CoreV1().Nodes().Patch(ctx, "node1", types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		waitKeyChange(t, c, "node1", keys["node1"])
	})
	t.Logf("node1 rotated its key on request: the stream stalled at most %v", worst)
	c.mustCheck(t)
}

// publishedKeys reads every node's WireGuard public key annotation.
func publishedKeys(t *testing.T, c *cluster) map[string]string {
	t.Helper()
	nodes, err := c.client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, n := range nodes.Items {
		out[n.Name] = n.Annotations[wireguard.PublicKeyAnnotation]
	}
	return out
}

func waitKeyChange(t *testing.T, c *cluster, node, old string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for publishedKeys(t, c)[node] == old {
		if time.Now().After(deadline) {
			t.Fatalf("%s kept its WireGuard key %s", node, old)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// underlayLink is the name of the link holding the member's address.
func underlayLink(t *testing.T, m lab.Member) string {
	t.Helper()
	var name string
	err := netnsutil.Do(m.NSPath(), func() error {
		addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if a.IP.Equal(m.IP.AsSlice()) {
				l, err := netlink.LinkByIndex(a.LinkIndex)
				if err != nil {
					return err
				}
				name = l.Attrs().Name
				return nil
			}
		}
		return fmt.Errorf("no link holds %s", m.IP)
	})
	if err != nil {
		t.Fatal(err)
	}
	return name
}

// classify lists the IPv4 packets that carry pod traffic in clear (a pod
// address, or VXLAN, whose inner packets are pods') and counts WireGuard's.
func classify(frames [][]byte) (clear []string, tunnel int) {
	pods := netip.MustParsePrefix(lab.ClusterCIDR)
	for _, f := range frames {
		p, ok := capture.IPv4(f)
		switch {
		case !ok || p.Proto != unix.IPPROTO_UDP && p.Proto != unix.IPPROTO_TCP && p.Proto != unix.IPPROTO_ICMP:
		case p.Proto == unix.IPPROTO_UDP && (p.SrcPort == wireguard.DefaultPort || p.DstPort == wireguard.DefaultPort):
			tunnel++
		case pods.Contains(p.Src) || pods.Contains(p.Dst) ||
			p.Proto == unix.IPPROTO_UDP && (p.SrcPort == routing.DefaultPort || p.DstPort == routing.DefaultPort):
			clear = append(clear, fmt.Sprintf("%s:%d > %s:%d proto %d", p.Src, p.SrcPort, p.Dst, p.DstPort, p.Proto))
		}
	}
	return clear, tunnel
}

// during exchanges lines while fn runs and for after more, and returns the
// longest exchange: how long the stream stalled. The bound of each exchange
// only stops a hang (TCP retransmits across a tunnel change).
func (s *stream) during(t *testing.T, after time.Duration, fn func()) time.Duration {
	t.Helper()
	stop := make(chan struct{})
	type result struct {
		worst time.Duration
		err   error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- r
				return
			case <-time.After(20 * time.Millisecond):
			}
			d, err := s.try(fmt.Sprintf("line %d", i), 30*time.Second)
			if err != nil {
				r.err = err
				done <- r
				return
			}
			r.worst = max(r.worst, d)
		}
	}()
	fn()
	time.Sleep(after)
	close(stop)
	r := <-done
	if r.err != nil {
		t.Fatalf("%s: %v", s.name, r.err)
	}
	return r.worst
}
