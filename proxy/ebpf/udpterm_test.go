package ebpf_test

import (
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/weftnet/weft/internal/netnsutil"
	weftebpf "github.com/weftnet/weft/proxy/ebpf"
	"github.com/weftnet/weft/proxy/proxytest"
)

// TestUDPTermination: when a backend leaves a UDP Service, the connected
// sockets translated for that Service to it are destroyed, in a pod's
// network namespace and in the node's; a socket of another Service to the
// same backend and a socket connected to the pod directly keep working.
func TestUDPTermination(t *testing.T) {
	n := proxytest.NewNode(t, backend, "a", "b", "c")
	udp := func(name, ip string) *corev1.Service {
		return proxytest.Service(name, ip, func(s *corev1.Service) {
			s.Spec.Ports = []corev1.ServicePort{{Name: "dns", Port: 81, Protocol: corev1.ProtocolUDP}}
		})
	}
	a := n.Pods["a"].IP.String()
	n.Svcs = []*corev1.Service{udp("dns", "10.96.0.53"), udp("other", "10.96.0.54")}
	n.Slices = append(n.Slices, proxytest.UDPSlice("dns", a), proxytest.UDPSlice("other", a))
	n.Sync()
	// dial connects a UDP socket in the namespace at ns ("": the node's).
	dial := func(ns, addr string) net.Conn {
		t.Helper()
		var c net.Conn
		var err error
		if ns == "" {
			c, err = net.Dial("udp", addr)
		} else {
			err = netnsutil.Do(ns, func() (err error) { c, err = net.Dial("udp", addr); return err })
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	ask := func(c net.Conn) (string, error) {
		_ = c.SetDeadline(time.Now().Add(time.Second))
		if _, err := c.Write([]byte("ping")); err != nil {
			return "", err
		}
		buf := make([]byte, 512)
		k, err := c.Read(buf)
		if err != nil {
			return "", err
		}
		return strings.Fields(string(buf[:k]))[0], nil
	}
	pod := n.Pods["c"].NS
	conns := map[string]net.Conn{
		"pod to dns":   dial(pod, "10.96.0.53:81"),
		"node to dns":  dial("", "10.96.0.53:81"),
		"pod to other": dial(pod, "10.96.0.54:81"),
		"pod to a":     dial(pod, a+":81"),
	}
	for name, c := range conns {
		if who, err := ask(c); who != "a" {
			t.Fatalf("%s before the change: answered by %q, %v; want a", name, who, err)
		}
	}
	n.Slices[0] = proxytest.UDPSlice("dns", n.Pods["b"].IP.String())
	n.Sync()
	// The sockets are terminated after the grace period that follows.
	if err := n.Backend.(*weftebpf.Backend).Settle(); err != nil {
		t.Fatal(err)
	}
	if got := n.Backend.(*weftebpf.Backend).LastStats().UDPSocketsTerminated; got != 2 {
		t.Errorf("%d sockets terminated, want 2 (dns's from the pod and from the node)", got)
	}
	for name, c := range conns {
		who, err := ask(c)
		if strings.HasSuffix(name, "to dns") {
			if !errors.Is(err, syscall.ECONNABORTED) && !errors.Is(err, syscall.EDESTADDRREQ) {
				t.Errorf("%s after a left dns: answered by %q, %v; want the socket terminated", name, who, err)
			}
		} else if who != "a" {
			t.Errorf("%s after a left dns: answered by %q, %v; want a, as before", name, who, err)
		}
	}
	if who, err := ask(dial(pod, "10.96.0.53:81")); who != "b" {
		t.Errorf("a new socket to dns: answered by %q, %v; want b", who, err)
	}
}
