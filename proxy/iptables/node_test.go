package iptables_test

import (
	"net/netip"
	"os"
	"testing"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/proxy/iptables"
	"github.com/weftnet/weft/proxy/proxytest"
)

func TestMain(m *testing.M) { os.Exit(netnsutil.RunTests(m)) }

// backend is the iptables backend as the shared scenario table runs it.
var backend = proxytest.Backend{Mode: "iptables"}

// TestScenarios runs the backend-neutral real-traffic scenario table.
func TestScenarios(t *testing.T) { proxytest.Run(t, backend) }

// newNode is a proxytest node with the iptables backend.
func newNode(t *testing.T, pods ...string) (*proxytest.Node, *iptables.Backend) {
	t.Helper()
	n := proxytest.NewNode(t, backend, pods...)
	return n, n.Backend.(*iptables.Backend)
}

// sync syncs the node and returns the IPv4 family's stats.
func sync(n *proxytest.Node) iptables.Stats {
	n.Sync()
	return n.Backend.(*iptables.Backend).LastStats[0]
}

// nodeConfig is the renderer's view of the test node, dual-stack, as
// proxy.Build derives it from the node's proxy.Config.
func nodeConfig() iptables.Config {
	return iptables.Config{NodeName: proxytest.NodeName,
		NodePortIPs:  []netip.Addr{netip.MustParseAddr(proxytest.NodeIP), netip.MustParseAddr(proxytest.NodeIP6)},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix(proxytest.Cluster), netip.MustParsePrefix(proxytest.Cluster6)}}
}
