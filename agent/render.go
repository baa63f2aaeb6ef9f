package agent

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/weftnet/weft/routing"
)

// VTEPMACAnnotation is where each node publishes its VXLAN device's MAC.
const VTEPMACAnnotation = "weft.dev/vtep-mac"

// CNIConfig is what the agent puts in the node's CNI configuration.
type CNIConfig struct {
	Bridge   string
	MTU      int
	PodCIDRs []netip.Prefix
	DataDir  string
}

// RenderConflist renders the node's CNI network list: weft, then the
// reference portmap plugin for hostPorts.
func RenderConflist(c CNIConfig) ([]byte, error) {
	ranges := make([][]map[string]string, len(c.PodCIDRs))
	for i, p := range c.PodCIDRs {
		ranges[i] = []map[string]string{{"subnet": p.String()}}
	}
	list := map[string]any{
		"cniVersion": "1.1.0",
		"name":       CNINetwork,
		"plugins": []map[string]any{
			{"type": "weft", "bridge": c.Bridge, "mtu": c.MTU, "ipam": map[string]any{"ranges": ranges, "dataDir": c.DataDir}},
			{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}, "snat": true},
		},
	}
	return json.MarshalIndent(list, "", "  ")
}

// Gateways returns the bridge address for each pod CIDR: its first address.
func Gateways(cidrs []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, len(cidrs))
	for i, p := range cidrs {
		out[i] = netip.PrefixFrom(p.Masked().Addr().Next(), p.Bits())
	}
	return out
}

// NodeError is a problem with one Node object; the node is skipped.
type NodeError struct {
	Node, Field string
	Err         error
}

func (e NodeError) Error() string { return fmt.Sprintf("node %q: %s: %v", e.Node, e.Field, e.Err) }

// RoutingNode converts a Node object to what the routing package needs.
// Unparseable fields are reported and left out; routing.Compute then skips
// a node that lacks what its mode needs.
func RoutingNode(n *corev1.Node) (routing.Node, []NodeError) {
	out := routing.Node{Name: n.Name}
	var errs []NodeError
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		ip, err := netip.ParseAddr(a.Address)
		if err != nil {
			errs = append(errs, NodeError{n.Name, "status.addresses[InternalIP]", err})
			continue
		}
		out.InternalIPs = append(out.InternalIPs, ip)
	}
	cidrs := n.Spec.PodCIDRs
	if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
		cidrs = []string{n.Spec.PodCIDR}
	}
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			errs = append(errs, NodeError{n.Name, "spec.podCIDRs", err})
			continue
		}
		out.PodCIDRs = append(out.PodCIDRs, p)
	}
	if s, ok := n.Annotations[VTEPMACAnnotation]; ok {
		mac, err := net.ParseMAC(s)
		if err != nil {
			errs = append(errs, NodeError{n.Name, "metadata.annotations[" + VTEPMACAnnotation + "]", err})
		} else {
			out.VTEPMAC = mac
		}
	}
	return out, errs
}

// MasqueradeRules renders the iptables-restore payload (used with
// --noflush) of the agent's own chains for one family: pod traffic leaving
// the cluster CIDRs is masqueraded to the node's address, and forwarding of
// pod traffic is accepted even where the FORWARD policy is DROP. Declaring a
// chain flushes only that chain.
func MasqueradeRules(clusterCIDRs []netip.Prefix) string {
	var b strings.Builder
	b.WriteString("*nat\n:WEFT-POSTROUTING - [0:0]\n")
	for _, c := range clusterCIDRs {
		for _, d := range clusterCIDRs {
			fmt.Fprintf(&b, "-A WEFT-POSTROUTING -s %s -d %s -m comment --comment \"pod to pod\" -j RETURN\n", c, d)
		}
		multicast := "224.0.0.0/4"
		if c.Addr().Is6() {
			multicast = "ff00::/8"
		}
		fmt.Fprintf(&b, "-A WEFT-POSTROUTING -s %s -d %s -j RETURN\n", c, multicast)
		fmt.Fprintf(&b, "-A WEFT-POSTROUTING -s %s -m comment --comment \"pod leaving the cluster\" -j MASQUERADE --random-fully\n", c)
	}
	b.WriteString("COMMIT\n*filter\n:WEFT-FORWARD - [0:0]\n")
	for _, c := range clusterCIDRs {
		fmt.Fprintf(&b, "-A WEFT-FORWARD -s %s -j ACCEPT\n", c)
		fmt.Fprintf(&b, "-A WEFT-FORWARD -d %s -j ACCEPT\n", c)
	}
	b.WriteString("COMMIT\n")
	return b.String()
}
