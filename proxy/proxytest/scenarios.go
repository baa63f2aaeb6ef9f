package proxytest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/internal/testutil"
	"github.com/weftnet/weft/proxy"
)

// services programs the shared Scenario and proves each feature with real
// connections: who answered and what source address the server saw.
func services(t *testing.T, b Backend) {
	n := NewNode(t, b, "a", "b", "c")
	a, pb, c := n.Pods["a"], n.Pods["b"], n.Pods["c"]
	for name, want := range map[string]string{"a": PodA, "b": PodB, "c": PodC} {
		if got := n.Pods[name].IP.String(); got != want {
			t.Fatalf("pod %s got %s from IPAM, the scenario expects %s", name, got, want)
		}
	}
	n.Svcs, n.Slices = Scenario()
	n.Sync()

	t.Run("ClusterIP from a pod spreads over endpoints, source kept", func(t *testing.T) {
		seen := map[string]bool{}
		for i := 0; i < 30; i++ {
			r, err := Get(a.NS, "", "http://10.96.0.10/")
			if err != nil {
				t.Fatal(err)
			}
			// Only a hairpin (a answering itself) may be masqueraded.
			if b.Supports(ClientAddress) && r.Pod != "a" && r.Client != a.IP.String() {
				t.Fatalf("%s saw %s, want the pod's own %s", r.Pod, r.Client, a.IP)
			}
			seen[r.Pod] = true
		}
		if len(seen) < 2 {
			t.Fatalf("30 requests all went to %v", seen)
		}
	})
	t.Run("ClusterIP from the node", func(t *testing.T) {
		if _, err := Get("", "", "http://10.96.0.10/"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("the peer address of a connection to a ClusterIP is the ClusterIP", func(t *testing.T) {
		var conn net.Conn
		if err := netnsutil.Do(pb.NS, func() (err error) {
			conn, err = net.DialTimeout("tcp", "10.96.0.10:81", time.Second)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		// Go fills RemoteAddr from getpeername(2) after connecting.
		if got := conn.RemoteAddr().String(); got != "10.96.0.10:81" {
			t.Fatalf("getpeername says %s, want the ClusterIP", got)
		}
	})
	t.Run("NodePort from the node", func(t *testing.T) {
		r, err := Get("", "", "http://"+NodeIP+":30080/")
		if err != nil || (r.Pod != "b" && r.Pod != "c") {
			t.Fatalf("%+v %v, want an endpoint of np", r, err)
		}
	})
	t.Run("externalIP from a pod", func(t *testing.T) {
		r, err := Get(a.NS, "", "http://"+ExtIPv4+"/")
		if err != nil || r.Pod != "b" {
			t.Fatalf("%+v %v, want b", r, err)
		}
	})
	fromOutside(t, b, n)
	t.Run("ClientIP affinity sticks", func(t *testing.T) {
		b.Need(t, Affinity)
		first := ""
		for i := 0; i < 15; i++ {
			r, err := Get(pb.NS, "", "http://10.96.0.15/")
			if err != nil {
				t.Fatal(err)
			}
			if first == "" {
				first = r.Pod
			}
			if r.Pod != first {
				t.Fatalf("request %d went to %s, the first to %s", i, r.Pod, first)
			}
		}
	})
	t.Run("internalTrafficPolicy Local uses only the local endpoint", func(t *testing.T) {
		for i := 0; i < 10; i++ {
			r, err := Get(pb.NS, "", "http://10.96.0.17/")
			if err != nil || r.Pod != "a" {
				t.Fatalf("%+v %v, want a (the remote endpoint is not used)", r, err)
			}
		}
	})
	t.Run("internalTrafficPolicy Local without a local endpoint drops", func(t *testing.T) {
		_, err := Get(c.NS, "", "http://10.96.0.18/")
		if err == nil || strings.Contains(err.Error(), "refused") {
			t.Fatalf("got %v, want a failure that is not connection refused (dropped)", err)
		}
	})
	t.Run("no endpoints is rejected at once", func(t *testing.T) {
		_, err := Get(c.NS, "", "http://10.96.0.16/")
		if err == nil || !strings.Contains(err.Error(), "refused") {
			t.Fatalf("got %v, want connection refused", err)
		}
	})
	t.Run("hairpin: a pod reaches itself through its service", func(t *testing.T) {
		r, err := Get(a.NS, "", "http://10.96.0.21/")
		if err != nil || r.Pod != "a" {
			t.Fatalf("%+v %v", r, err)
		}
	})
	t.Run("UDP to a ClusterIP is answered from the ClusterIP", func(t *testing.T) {
		// An unconnected socket: each datagram names the VIP, and the
		// reply must come back from it (resolvers drop other sources).
		var conn net.PacketConn
		if err := netnsutil.Do(pb.NS, func() (err error) { conn, err = net.ListenPacket("udp4", ":0"); return err }); err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		vip := &net.UDPAddr{IP: net.ParseIP("10.96.0.53"), Port: 81}
		_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := conn.WriteTo([]byte("ping"), vip); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 512)
		k, from, err := conn.ReadFrom(buf)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Fields(string(buf[:k])); len(got) == 0 || got[0] != "a" || from.String() != vip.String() {
			t.Fatalf("answer %q from %s, want a's answer from %s", buf[:k], from, vip)
		}
	})
	// Last: it changes the scenario.
	t.Run("ClientIP affinity leaves an endpoint removed from the Service", func(t *testing.T) {
		b.Need(t, Affinity)
		r, err := Get(pb.NS, "", "http://10.96.0.15/")
		if err != nil {
			t.Fatal(err)
		}
		first := r.Pod
		// The remembered endpoint leaves sticky but stays an endpoint of web.
		var rest []Endpoint
		for _, name := range []string{"a", "b", "c"} {
			if name != first {
				rest = append(rest, n.Local(name))
			}
		}
		for i, es := range n.Slices {
			if es.Labels[discoveryv1.LabelServiceName] == "sticky" {
				n.Slices[i] = Slice("sticky", rest...)
			}
		}
		n.Sync()
		for i := 0; i < 10; i++ {
			r, err := Get(pb.NS, "", "http://10.96.0.15/")
			if err != nil || r.Pod == first {
				t.Fatalf("request %d after %s left the Service: %+v %v", i, first, r, err)
			}
		}
	})
}

// fromOutside checks the Scenario's NodePorts, externalIP and
// LoadBalancer IP from the outside host.
func fromOutside(t *testing.T, b Backend, n *Node) {
	t.Run("NodePort from outside is masqueraded", func(t *testing.T) {
		b.Need(t, ExternalTraffic)
		for i := 0; i < 5; i++ {
			r, err := n.GetOutside("", "http://"+NodeIP+":30080/")
			if err != nil {
				t.Fatal(err)
			}
			if r.Pod != "b" && r.Pod != "c" {
				t.Fatalf("answered by %s, not an endpoint of np", r.Pod)
			}
			if r.Client == ExtIP || !strings.HasPrefix(r.Client, "10.244.1.") {
				t.Fatalf("%s saw %s, want the node's address (SNAT)", r.Pod, r.Client)
			}
		}
	})
	t.Run("externalTrafficPolicy Local keeps the client address and the local endpoint", func(t *testing.T) {
		b.Need(t, ExternalTraffic)
		for i := 0; i < 8; i++ {
			r, err := n.GetOutside("", "http://"+NodeIP+":30081/")
			if err != nil {
				t.Fatal(err)
			}
			if r.Pod != "c" || (b.Supports(ClientAddress) && r.Client != ExtIP) {
				t.Fatalf("%s saw %s, want c seeing %s", r.Pod, r.Client, ExtIP)
			}
		}
	})
	t.Run("externalTrafficPolicy Local without a local endpoint drops", func(t *testing.T) {
		b.Need(t, ExternalTraffic)
		_, err := n.GetOutside("", "http://"+NodeIP+":30082/")
		if err == nil || strings.Contains(err.Error(), "refused") {
			t.Fatalf("got %v, want a timeout (dropped)", err)
		}
	})
	t.Run("externalIP from outside", func(t *testing.T) {
		b.Need(t, ExternalTraffic)
		r, err := n.GetOutside("", "http://"+ExtIPv4+"/")
		if err != nil || r.Pod != "b" {
			t.Fatalf("%+v %v, want b", r, err)
		}
	})
	t.Run("LoadBalancer IP allowed and blocked by sourceRanges", func(t *testing.T) {
		b.Need(t, ExternalTraffic)
		r, err := n.GetOutside(ExtIP, "http://"+LBIP+"/")
		if err != nil || r.Pod != "b" {
			t.Fatalf("from %s: %+v %v, want b", ExtIP, r, err)
		}
		if r, err := n.GetOutside(ExtIP2, "http://"+LBIP+"/"); err == nil {
			t.Fatalf("from %s (outside sourceRanges) answered by %s", ExtIP2, r.Pod)
		}
	})
}

// uplinks: the Scenario's traffic from outside works when the node's
// addresses are on a bridge (bridge netfilter on), a bond or a VLAN device
// rather than on the link itself.
func uplinks(t *testing.T, b Backend) {
	for _, k := range []UplinkKind{BridgedUplink, BondedUplink, VLANUplink} {
		t.Run(string(k), func(t *testing.T) {
			n := NewNodeOn(t, b, k, "a", "b", "c")
			n.Svcs, n.Slices = Scenario()
			n.Sync()
			fromOutside(t, b, n)
		})
	}
}

// dualStack: a dual-stack Service answers on its IPv6 ClusterIP from a pod
// (source kept), on its IPv4 ClusterIP, and on the node's IPv6 address as
// a NodePort from outside (SNAT).
func dualStack(t *testing.T, b Backend) {
	n := NewNode(t, b, "a", "b")
	a := n.Pods["a"]
	n.Svcs = []*corev1.Service{Service("dual", "10.96.0.20", func(s *corev1.Service) {
		s.Spec.ClusterIPs = []string{"10.96.0.20", "fd00:96::20"}
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = 30090
	})}
	v6 := Slice("dual", Endpoint{n.Pods["b"].IP6.String(), NodeName})
	v6.Name, v6.AddressType = "dual-v6", discoveryv1.AddressTypeIPv6
	n.Slices = []*discoveryv1.EndpointSlice{Slice("dual", n.Local("b")), v6}
	n.Sync()
	t.Run("IPv6 ClusterIP from a pod", func(t *testing.T) {
		r, err := Get(a.NS, "", "http://[fd00:96::20]/")
		if err != nil || r.Pod != "b" || (b.Supports(ClientAddress) && r.Client != a.IP6.String()) {
			t.Fatalf("%+v %v, want b seeing %s", r, err, a.IP6)
		}
	})
	t.Run("IPv4 ClusterIP of the same Service", func(t *testing.T) {
		if r, err := Get(a.NS, "", "http://10.96.0.20/"); err != nil || r.Pod != "b" {
			t.Fatalf("%+v %v", r, err)
		}
	})
	t.Run("IPv6 NodePort from the node", func(t *testing.T) {
		if r, err := Get("", "", "http://["+NodeIP6+"]:30090/"); err != nil || r.Pod != "b" {
			t.Fatalf("%+v %v", r, err)
		}
	})
	t.Run("IPv6 NodePort from outside is masqueraded", func(t *testing.T) {
		b.Need(t, ExternalTraffic)
		r, err := n.GetOutside("", "http://["+NodeIP6+"]:30090/")
		if err != nil || r.Pod != "b" || r.Client == ExtIP6 {
			t.Fatalf("%+v %v, want b seeing a node address", r, err)
		}
	})
}

// restart: a connection opened through a Service keeps working while a
// fresh backend (a restarted proxy) does its first, full sync, and the
// Services keep answering.
func restart(t *testing.T, b Backend) {
	n := NewNode(t, b, "a", "b")
	for i := 0; i < 20; i++ {
		ip := fmt.Sprintf("10.96.1.%d", i+1)
		n.Svcs = append(n.Svcs, Service(fmt.Sprintf("s%d", i), ip, nil))
		n.Slices = append(n.Slices, Slice(fmt.Sprintf("s%d", i), n.Local("a")))
	}
	n.Sync()
	var conn net.Conn
	if err := netnsutil.Do(n.Pods["b"].NS, func() (err error) {
		conn, err = net.DialTimeout("tcp", "10.96.1.1:81", 2*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	echo := NewEcho(conn)
	if err := echo.Say("hello"); err != nil {
		t.Fatal(err)
	}
	n.Backend = n.NewBackend()
	n.Sync()
	if b.Supports(ConnectionsSurviveRestart) {
		if err := echo.Say("after restart"); err != nil {
			t.Fatalf("after restart: %v", err)
		}
	}
	if r, err := Get(n.Pods["b"].NS, "", "http://10.96.1.4/"); err != nil || r.Pod != "a" {
		t.Fatalf("service after restart: %+v %v", r, err)
	}
}

// RunProxier runs the whole proxy (tracker, runner, backend, health
// checks, conntrack cleanup) built from c (a node's Config, or one changed
// from it), fed directly with objects, until the test ends.
func RunProxier(t *testing.T, c proxy.Config) *proxy.Proxier {
	t.Helper()
	c.HealthCheckPorts, c.MinSyncPeriod, c.Log = true, 10*time.Millisecond, slog.New(slog.NewTextHandler(io.Discard, nil))
	p, _, err := proxy.Build(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; _ = p.Cleanup() })
	return p
}

// udpBackendReplaced: a UDP client that keeps its connected socket to a
// ClusterIP reaches the new backend once the old one is removed; with a
// backend that terminates such sockets, the socket fails and a new one
// reaches it.
func udpBackendReplaced(t *testing.T, b Backend) {
	n := NewNode(t, b, "a", "b", "c")
	old := UDPSlice("dns", n.Pods["a"].IP.String())
	udpMove(t, b, n, "10.96.0.53:81", nil, old, UDPSlice("dns", n.Pods["b"].IP.String()), "a", "b")
}

// udpTargetPortChanged: the same for a NodePort whose endpoint stays but
// moves to another target port (the upstream suite's "cleanup conntrack
// entries when UDP service target port changes"): a kept UDP flow must
// reach the new port, not stay on the old one.
func udpTargetPortChanged(t *testing.T, b Backend) {
	n := NewNode(t, b, "a", "c")
	// A second UDP server in pod a, on port 82, answering as "a:82".
	if err := netnsutil.Do(n.Pods["a"].NS, func() error {
		conn, err := net.ListenPacket("udp", ":82")
		if err != nil {
			return err
		}
		t.Cleanup(func() { conn.Close() })
		go func() {
			buf := make([]byte, 512)
			for {
				_, from, err := conn.ReadFrom(buf)
				if err != nil {
					return
				}
				_, _ = conn.WriteTo([]byte("a:82\n"), from)
			}
		}()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	old := UDPSlice("dns", n.Pods["a"].IP.String())
	moved := UDPSlice("dns", n.Pods["a"].IP.String())
	port := int32(82)
	moved.Ports[0].Port = &port
	nodePort := func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = 30082
	}
	udpMove(t, b, n, NodeIP+":30082", nodePort, old, moved, "a", "a:82")
}

// udpMove runs the proxier with the UDP Service dns (port 81, changed by
// mutate) and its slice old; a connected UDP socket from pod c to addr is
// answered by first; once the slice is replaced by next, it is answered by
// then (or, with a backend that terminates such sockets, it fails and a new
// socket is answered by then).
func udpMove(t *testing.T, b Backend, n *Node, addr string, mutate func(*corev1.Service), old, next *discoveryv1.EndpointSlice, first, then string) {
	t.Helper()
	b.Need(t, UDPSocketMove)
	p := RunProxier(t, n.Config)
	svc := Service("dns", "10.96.0.53", func(s *corev1.Service) {
		s.Spec.Ports = []corev1.ServicePort{{Name: "dns", Port: 81, Protocol: corev1.ProtocolUDP}}
		if mutate != nil {
			mutate(s)
		}
	})
	p.OnService(nil, svc)
	p.OnEndpointSlice(nil, old)
	p.OnSynced()
	// A socket-level backend translates at connect time: dial once the
	// Service is programmed.
	testutil.Eventually(t, 10*time.Second, "the first sync", p.Healthy)

	var conn net.Conn
	dial := func() {
		t.Helper()
		if err := netnsutil.Do(n.Pods["c"].NS, func() (err error) { conn, err = net.Dial("udp", addr); return err }); err != nil {
			t.Fatal(err)
		}
		c := conn
		t.Cleanup(func() { c.Close() })
	}
	dial()
	// ask returns who answered, or the socket's error.
	ask := func() (string, error) {
		_ = conn.SetDeadline(time.Now().Add(200 * time.Millisecond))
		if _, err := conn.Write([]byte("ping")); err != nil {
			return "", err
		}
		buf := make([]byte, 512)
		k, err := conn.Read(buf)
		if err != nil {
			return "", err
		}
		return strings.Fields(string(buf[:k]))[0], nil
	}
	answeredBy := func(who string) func() bool {
		return func() bool { got, _ := ask(); return got == who }
	}
	testutil.Eventually(t, 10*time.Second, "the first UDP answer from "+first, answeredBy(first))
	p.OnEndpointSlice(old, next)
	if !b.TerminatesUDP {
		testutil.Eventually(t, 10*time.Second, "the same UDP socket answered by "+then, answeredBy(then))
		return
	}
	// The old server still runs: a socket left connected to it would go on
	// being answered.
	testutil.Eventually(t, 10*time.Second, "the connected UDP socket terminated", func() bool {
		_, err := ask()
		return errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.EDESTADDRREQ)
	})
	dial()
	testutil.Eventually(t, 10*time.Second, "a new UDP socket answered by "+then, answeredBy(then))
}

// healthCheckNodePort: 200 with the local endpoint count, 503 without.
func healthCheckNodePort(t *testing.T, b Backend) {
	n := NewNode(t, b, "a")
	p := RunProxier(t, n.Config)
	svc := Service("local", "10.96.0.12", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer // health-check node ports are a LoadBalancer feature
		s.Spec.Ports = s.Spec.Ports[:1]
		s.Spec.Ports[0].NodePort = 30081
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		s.Spec.HealthCheckNodePort = 32001
	})
	withLocal := Slice("local", n.Local("a"))
	p.OnService(nil, svc)
	p.OnEndpointSlice(nil, withLocal)
	p.OnSynced()
	health := func() (int, int) {
		c := &http.Client{Timeout: time.Second, Transport: &http.Transport{DialContext: netnsutil.Dialer(n.Ext, nil)}}
		resp, err := c.Get("http://" + NodeIP + ":32001/")
		if err != nil {
			return 0, -1
		}
		defer resp.Body.Close()
		var body struct {
			LocalEndpoints int `json:"localEndpoints"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, body.LocalEndpoints
	}
	testutil.Eventually(t, 10*time.Second, "health check 200 with 1 local endpoint", func() bool { code, k := health(); return code == 200 && k == 1 })
	// Only terminating local endpoints: they still drain the node's
	// connections, but the check fails so that a load balancer sends new
	// ones elsewhere.
	terminating := Slice("local", n.Local("a"))
	no, yes := false, true
	terminating.Endpoints[0].Conditions = discoveryv1.EndpointConditions{Ready: &no, Serving: &yes, Terminating: &yes}
	p.OnEndpointSlice(withLocal, terminating)
	testutil.Eventually(t, 10*time.Second, "health check 503 with only a terminating local endpoint", func() bool { code, k := health(); return code == 503 && k == 0 })
	p.OnEndpointSlice(terminating, withLocal)
	testutil.Eventually(t, 10*time.Second, "health check 200 again", func() bool { code, k := health(); return code == 200 && k == 1 })
	p.OnEndpointSlice(withLocal, Slice("local", Endpoint{RemoteEP, OtherNode}))
	testutil.Eventually(t, 10*time.Second, "health check 503 with 0 local endpoints", func() bool { code, k := health(); return code == 503 && k == 0 })
}
