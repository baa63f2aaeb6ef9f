package nftables_test

import (
	"os"
	"testing"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/proxy/nftables"
	"github.com/weftnet/weft/proxy/proxytest"
)

func TestMain(m *testing.M) { os.Exit(netnsutil.RunTests(m)) }

// backend is the nftables backend as the shared scenario table runs it.
var backend = proxytest.Backend{Mode: "nftables"}

// TestScenarios runs the backend-neutral real-traffic scenario table.
func TestScenarios(t *testing.T) { proxytest.Run(t, backend) }

// newNode is a proxytest node with the nftables backend.
func newNode(t *testing.T, pods ...string) (*proxytest.Node, *nftables.Backend) {
	t.Helper()
	n := proxytest.NewNode(t, backend, pods...)
	return n, n.Backend.(*nftables.Backend)
}
