package lab

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/weftnet/weft/internal/netnsutil"
)

// waitNodesReady waits until every node is registered, has a podCIDR, and
// its agent has cleared NetworkUnavailable, and returns the Nodes.
func waitNodesReady(ctx context.Context, c kubernetes.Interface, nodes []Member) ([]*corev1.Node, error) {
	pending := map[string]string{}
	for {
		clear(pending)
		var ready []*corev1.Node
		for _, m := range nodes {
			n, err := c.CoreV1().Nodes().Get(ctx, m.Name, metav1.GetOptions{})
			ready = append(ready, n)
			switch {
			case err != nil:
				pending[m.Name] = "not registered"
			case len(n.Spec.PodCIDRs) == 0:
				pending[m.Name] = "no podCIDR"
			case !networkReady(n):
				pending[m.Name] = "routes not programmed"
			}
		}
		if len(pending) == 0 {
			return ready, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("nodes not ready %v (see the logs in the lab dir): %w", pending, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func networkReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeNetworkUnavailable {
			return c.Status == corev1.ConditionFalse
		}
	}
	return false
}

// routeControlPlaneToPods gives the control plane's namespace a route to
// each node's podCIDR through the node, as a control plane running on
// cluster nodes has: the API server reaches pods for its proxy
// subresource (`kubectl get --raw .../pods/NAME:PORT/proxy/`, which e2e
// specs read results through) and webhooks. On racks the ToR routes pod
// addresses it learns by BGP; with other routing there, the control plane
// does not reach pods.
// The Nodes are members' (in the same order).
func routeControlPlaneToPods(members []Member, nodes []*corev1.Node) error {
	var routes []netlink.Route
	for i, n := range nodes {
		m := members[i]
		for _, cidr := range n.Spec.PodCIDRs {
			_, dst, err := net.ParseCIDR(cidr)
			if err != nil {
				return fmt.Errorf("node %s: podCIDR %q: %w", m.Name, cidr, err)
			}
			switch {
			case dst.IP.To4() != nil:
				routes = append(routes, netlink.Route{Dst: dst, Gw: m.IP.AsSlice()})
			case m.IP6.IsValid():
				routes = append(routes, netlink.Route{Dst: dst, Gw: m.IP6.AsSlice()})
			}
		}
	}
	return netnsutil.Do(netnsutil.RunDir+"/"+ControlNS, func() error {
		for _, r := range routes {
			if err := netlink.RouteReplace(&r); err != nil {
				return fmt.Errorf("control plane route to %s: %w", r.Dst, err)
			}
		}
		return nil
	})
}
