package userspace_test

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/proxy"
	"github.com/weftnet/weft/proxy/model"
	"github.com/weftnet/weft/proxy/proxytest"
	"github.com/weftnet/weft/proxy/userspace"
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

// TestRedirect checks, with each glue, what the scenario table does not:
// the endpoint sees the node (the proxy relayed the connection); a
// listener's port is reachable only through the glue; a derived port held
// by someone else is skipped for the next; a restarted proxy (Cleanup,
// then a new backend) serves again; Cleanup leaves nothing.
func TestRedirect(t *testing.T) {
	for _, glue := range []string{"iptables", "nftables"} {
		t.Run(glue, func(t *testing.T) { redirect(t, glue) })
	}
}

func redirect(t *testing.T, glue string) {
	if testing.Short() || !netnsutil.Isolated() {
		t.Skip("kernel test: needs root (private network namespace), not -short")
	}
	web := proxytest.Service("web", "10.96.0.10", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = 30080
	})
	// The first port web's ClusterIP listener would try is held.
	k := userspace.Key{Port: model.ServicePortName{Namespace: "default", Name: "web", Port: "http", Protocol: model.TCP}, Scope: userspace.Internal}
	first := userspace.Candidates(k, 80, false, userspace.DefaultPortRange)[0]
	held, err := net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", first))
	switch {
	case err == nil:
		defer held.Close()
	case !errors.Is(err, syscall.EADDRINUSE): // held already (an earlier test's proxy): as good
		t.Fatal(err)
	}

	n := proxytest.NewNode(t, backend(glue), "a", "b")
	n.Svcs = []*corev1.Service{web}
	n.Slices = []*discoveryv1.EndpointSlice{proxytest.Slice("web", n.Local("a"), n.Local("b"))}
	n.Sync()
	b := n.Backend.(*userspace.Backend)
	gateway := netip.MustParsePrefix(proxytest.PodCIDR).Addr().Next().String()
	r, err := proxytest.Get(n.Pods["a"].NS, "", "http://10.96.0.10/")
	if err != nil || r.Client != gateway {
		t.Fatalf("%+v %v, want the endpoint to see the node's %s", r, err, gateway)
	}
	var listen, nodePort string
	for _, e := range b.Services() {
		switch e.Scope {
		case userspace.Internal:
			if e.Port == "http" {
				listen = e.Address
			}
		case userspace.External:
			nodePort = e.Address
		}
	}
	if _, port, _ := net.SplitHostPort(listen); port == fmt.Sprint(first) || port == "" {
		t.Fatalf("web's listener is at %q; port %d was held", listen, first)
	}
	if r, err := n.GetOutside("", "http://"+proxytest.NodeIP+":30080/"); err != nil || (r.Pod != "a" && r.Pod != "b") {
		t.Fatalf("NodePort from outside: %+v %v", r, err)
	}
	_, port, _ := net.SplitHostPort(nodePort)
	if r, err := n.GetOutside("", "http://"+proxytest.NodeIP+":"+port+"/"); err == nil {
		t.Fatalf("the NodePort listener's own port %s answered from outside (%s): the guard lets it through", port, r.Pod)
	}

	// A restart: the old proxy cleans up and exits, a new one syncs.
	if err := b.Cleanup(); err != nil {
		t.Fatal(err)
	}
	n.Backend = n.NewBackend()
	n.Sync()
	if r, err := proxytest.Get(n.Pods["b"].NS, "", "http://10.96.0.10/"); err != nil {
		t.Fatalf("after a restart: %+v %v", r, err)
	}
	if err := n.Backend.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if out, _ := exec.Command("iptables-save").Output(); strings.Contains(string(out), "WEFT-USERSPACE") {
		t.Fatalf("iptables rules left after Cleanup:\n%s", out)
	}
	if out, _ := exec.Command("ip6tables-save").Output(); strings.Contains(string(out), "WEFT-USERSPACE") {
		t.Fatalf("ip6tables rules left after Cleanup:\n%s", out)
	}
	if out, err := exec.Command("nft", "list", "table", "inet", userspace.TableName).CombinedOutput(); err == nil {
		t.Fatalf("table left after Cleanup:\n%s", out)
	}
}
