package proxytest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/internal/testutil"
	"github.com/weftnet/weft/proxy"
	"github.com/weftnet/weft/proxy/model"
)

// echoConn is a connection to the workload's TCP echo port through a
// Service, and the pod that answered.
type echoConn struct {
	net.Conn
	r   *bufio.Reader
	pod string
}

// dialer dials from a namespace.
type dialer func(ctx context.Context, network, addr string) (net.Conn, error)

// dialEcho connects to addr with dial, sends a first line and reads the
// workload's answer ("<pod> saw <ip>").
func dialEcho(dial dialer, addr string) (*echoConn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	ec := &echoConn{Conn: c, r: bufio.NewReader(c)}
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := fmt.Fprintln(c, "hello"); err != nil {
		c.Close()
		return nil, err
	}
	line, err := ec.r.ReadString('\n')
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("the greeting from %s: %w", addr, err)
	}
	ec.pod = strings.Fields(line)[0]
	return ec, nil
}

// dialTo connects to addr with dial until a connection lands on pod.
func dialTo(t *testing.T, dial dialer, addr, pod string) *echoConn {
	t.Helper()
	for range 50 {
		c, err := dialEcho(dial, addr)
		if err != nil {
			t.Fatal(err)
		}
		if c.pod == pod {
			t.Cleanup(func() { c.Close() })
			return c
		}
		c.Close()
	}
	t.Fatalf("50 connections to %s, none to %s", addr, pod)
	return nil
}

// alive checks that c still echoes.
func (c *echoConn) alive() error {
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := fmt.Fprintln(c, "ping"); err != nil {
		return err
	}
	_, err := c.r.ReadString('\n')
	return err
}

// waitRead starts a read that waits for the server (which sends nothing
// unasked) and returns what ends it, within limit.
func (c *echoConn) waitRead(limit time.Duration) <-chan error {
	done := make(chan error, 1)
	go func() {
		_ = c.SetReadDeadline(time.Now().Add(limit))
		_, err := c.r.ReadByte()
		done <- err
	}()
	return done
}

// resetOnRemoval: drain, then reset. A connection to an endpoint that is
// terminating but serving keeps working; once the endpoint (cut off
// without closing anything, as a vanished pod) leaves the Service, the
// client waiting on it gets ECONNRESET, through a ClusterIP and through a
// NodePort from outside, and a client on the node itself ECONNABORTED (its
// socket aborted; ECONNRESET where the backend owns the socket it
// reached); a connection to the endpoint that stays is untouched, and so
// is one through a Service that opted out.
func resetOnRemoval(t *testing.T, b Backend) {
	n := NewNode(t, b, "a", "b", "c")
	p := RunProxier(t, n.Config)
	web := Service("web", "10.96.0.10", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports[1].NodePort = 30081
	})
	kept := Service("kept", "10.96.0.11", func(s *corev1.Service) {
		s.Annotations = map[string]string{model.AnnotationResetConnections: "false"}
	})
	both := func(svc string) *discoveryv1.EndpointSlice { return Slice(svc, n.Local("a"), n.Local("b")) }
	webSlice, keptSlice := both("web"), both("kept")
	p.OnService(nil, web)
	p.OnService(nil, kept)
	p.OnEndpointSlice(nil, webSlice)
	p.OnEndpointSlice(nil, keptSlice)
	p.OnSynced()
	testutil.Eventually(t, 10*time.Second, "the first sync", p.Healthy)

	c := netnsutil.Dialer(n.Pods["c"].NS, nil)
	toA, toB, keptA := dialTo(t, c, "10.96.0.10:81", "a"), dialTo(t, c, "10.96.0.10:81", "b"), dialTo(t, c, "10.96.0.11:81", "a")
	fromNode := dialTo(t, (&net.Dialer{}).DialContext, "10.96.0.10:81", "a")
	var outsideA *echoConn
	if b.Supports(ExternalTraffic) {
		outsideA = dialTo(t, n.outsideDialer(), NodeIP+":30081", "a")
	}

	// a terminates, still serving: new connections go to b, a's drain.
	update := func(old **discoveryv1.EndpointSlice, next *discoveryv1.EndpointSlice) {
		p.OnEndpointSlice(*old, next)
		*old = next
	}
	terminating := func(svc string) *discoveryv1.EndpointSlice {
		es := both(svc)
		no, yes := false, true
		es.Endpoints[0].Conditions = discoveryv1.EndpointConditions{Ready: &no, Serving: &yes, Terminating: &yes}
		return es
	}
	update(&webSlice, terminating("web"))
	update(&keptSlice, terminating("kept"))
	onlyToB := func(addr string) func() bool {
		return func() bool {
			for range 5 {
				if c, err := dialEcho(c, addr); err != nil || c.Close() != nil || c.pod != "b" {
					return false
				}
			}
			return true
		}
	}
	testutil.Eventually(t, 10*time.Second, "new connections to b only", onlyToB("10.96.0.10:81"))
	if err := toA.alive(); err != nil {
		t.Fatalf("a connection to a terminating, serving endpoint: %v", err)
	}

	// a vanishes without a word, then leaves both Services.
	if out, err := exec.Command("ip", "-n", "proxytest-a", "link", "set", "eth0", "down").CombinedOutput(); err != nil {
		t.Fatalf("cutting pod a off: %v: %s", err, out)
	}
	waits := map[string]<-chan error{"ClusterIP": toA.waitRead(10 * time.Second), "ClusterIP from the node": fromNode.waitRead(10 * time.Second)}
	if outsideA != nil {
		waits["NodePort from outside"] = outsideA.waitRead(10 * time.Second)
	}
	// Ends when the test closes the connection, unless reset before.
	keptRead := keptA.waitRead(time.Hour)
	update(&webSlice, Slice("web", n.Local("b")))
	update(&keptSlice, Slice("kept", n.Local("b")))
	for name, w := range waits {
		err := <-w
		if name == "ClusterIP from the node" && errors.Is(err, syscall.ECONNABORTED) {
			continue
		}
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("%s, to the removed endpoint: the client's read ended with %v, want ECONNRESET", name, err)
		}
	}
	// Once both removals are programmed and every reset they queued is
	// done, the connection through the Service that keeps its connections
	// is still waiting.
	testutil.Eventually(t, 10*time.Second, "kept's removal programmed", onlyToB("10.96.0.11:81"))
	p.WaitResets()
	select {
	case err := <-keptRead:
		t.Errorf("through the Service that keeps its connections: the read ended with %v, want the connection left alone", err)
	default:
	}
	if err := toB.alive(); err != nil {
		t.Fatalf("a connection to the endpoint that stays: %v", err)
	}
}

// takeOver: a node switched to b's mode from another (iptables; nftables
// when b is iptables) keeps the connections the old mode translated (TCP
// from a pod to a ClusterIP and from outside to a NodePort, a connected
// UDP socket), and no rule of the old mode is left once b's first sync is
// done.
func takeOver(t *testing.T, b Backend) {
	from := "iptables"
	if b.Mode == "iptables" {
		from = "nftables"
	}
	n := NewNode(t, b, "a", "b", "c")
	web := Service("web", "10.96.0.10", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports[1].NodePort = 30081
	})
	svcs := []*corev1.Service{web, Service("dns", "10.96.0.53", func(s *corev1.Service) {
		s.Spec.Ports = []corev1.ServicePort{{Name: "dns", Port: 81, Protocol: corev1.ProtocolUDP}}
	})}
	slices := []*discoveryv1.EndpointSlice{Slice("web", n.Local("a"), n.Local("b")), UDPSlice("dns", n.Pods["a"].IP.String())}
	old := n.Config
	old.Mode = from
	_, ob, err := proxy.Build(old)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ob.Cleanup() })
	st, errs := model.Build(svcs, slices)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if err := ob.Sync(st, true); err != nil {
		t.Fatal(err)
	}

	pod := netnsutil.Dialer(n.Pods["c"].NS, nil)
	conns := map[string]*echoConn{"ClusterIP from a pod": dialTo(t, pod, "10.96.0.10:81", "a")}
	if b.Supports(ExternalTraffic) {
		conns["NodePort from outside"] = dialTo(t, n.outsideDialer(), NodeIP+":30081", "a")
	}
	var udp net.Conn
	if err := netnsutil.Do(n.Pods["c"].NS, func() (err error) { udp, err = net.Dial("udp", "10.96.0.53:81"); return err }); err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	askUDP := func() error {
		_ = udp.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := udp.Write([]byte("ping")); err != nil {
			return err
		}
		buf := make([]byte, 512)
		k, err := udp.Read(buf)
		if err == nil && !strings.HasPrefix(string(buf[:k]), "a ") {
			err = fmt.Errorf("answered %q, want a", buf[:k])
		}
		return err
	}
	if err := askUDP(); err != nil {
		t.Fatalf("UDP before the switch: %v", err)
	}

	p := RunProxier(t, n.Config)
	for _, s := range svcs {
		p.OnService(nil, s)
	}
	for _, es := range slices {
		p.OnEndpointSlice(nil, es)
	}
	p.OnSynced()
	testutil.Eventually(t, 10*time.Second, "the first sync", p.Healthy)
	for name, c := range conns {
		if err := c.alive(); err != nil {
			t.Errorf("%s, opened under %s, after %s took over: %v", name, from, b.Mode, err)
		}
	}
	if err := askUDP(); err != nil {
		t.Errorf("the connected UDP socket, after %s took over: %v", b.Mode, err)
	}
	if left := modeState(t, from); left != "" {
		t.Errorf("%s took over, and the %s mode's rules are still there:\n%s", b.Mode, from, left)
	}
}

// modeState is what the iptables or nftables mode has programmed in the
// node's network namespace ("" for nothing).
func modeState(t *testing.T, mode string) string {
	t.Helper()
	if mode == "nftables" {
		out, err := exec.Command("nft", "list", "table", "inet", "weft").CombinedOutput()
		if err != nil {
			return "" // no such table
		}
		return string(out)
	}
	var left []string
	for _, cmd := range []string{"iptables-save", "ip6tables-save"} {
		out, err := exec.Command(cmd).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v: %s", cmd, err, out)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "WEFT-SERVICES") || strings.Contains(l, "WEFT-SVC-POSTROUTING") {
				left = append(left, l)
			}
		}
	}
	return strings.Join(left, "\n")
}
