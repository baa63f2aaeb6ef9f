package userspace_test

import (
	"os"
	"testing"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/proxy"
	"github.com/weftnet/weft/proxy/proxytest"
)

func TestMain(m *testing.M) { os.Exit(netnsutil.RunTests(m)) }

// unsupported is what the userspace proxy cannot do, by design.
var unsupported = map[proxytest.Feature]string{
	proxytest.ClientAddress: "the proxy opens its own connection to the endpoint, which sees the node's address " +
		"(as upstream documented for its userspace mode)",
	proxytest.ConnectionsSurviveRestart: "connections are copied by the proxy process and end with it",
}

// backend is the userspace backend in redirect mode with the given glue,
// as the shared scenario table runs it.
func backend(glue string) proxytest.Backend {
	return proxytest.Backend{Mode: "userspace", Unsupported: unsupported,
		Setup: func(_ *testing.T, c *proxy.Config) { c.Userspace.Glue = glue }}
}

// TestScenarios runs the backend-neutral real-traffic scenario table with
// each glue.
func TestScenarios(t *testing.T) {
	for _, glue := range []string{"iptables", "nftables"} {
		t.Run(glue, func(t *testing.T) { proxytest.Run(t, backend(glue)) })
	}
}
