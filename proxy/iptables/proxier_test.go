package iptables_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/internal/testutil"
	"github.com/weftnet/weft/proxy"
)

// runProxier runs the whole proxy (tracker, runner, backend, health checks,
// conntrack cleanup) on the test node, fed directly with objects.
func runProxier(t *testing.T, n *node) *proxy.Proxier {
	t.Helper()
	p, _, err := proxy.Build(proxy.Config{NodeName: nodeName, NodeIPs: []netip.Addr{netip.MustParseAddr(nodeIP)},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix(cluster)}, HealthCheckPorts: true, MinSyncPeriod: 10 * time.Millisecond,
		Log: slogDiscard()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; _ = p.Cleanup() })
	return p
}

func udpSlice(svc string, ips ...string) *discoveryv1.EndpointSlice {
	es := slice(svc)
	name, udp, port := "dns", corev1.ProtocolUDP, int32(81)
	es.Ports = []discoveryv1.EndpointPort{{Name: &name, Protocol: &udp, Port: &port}}
	for _, ip := range ips {
		ready, node := true, nodeName
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}, NodeName: &node})
	}
	return es
}

// TestUDPBackendReplaced: a UDP client that keeps its socket reaches the new
// backend once the old one is removed (stale conntrack entries flushed).
func TestUDPBackendReplaced(t *testing.T) {
	n := newNode(t, "a", "b", "c")
	p := runProxier(t, n)
	svc := service("dns", "10.96.0.53", func(s *corev1.Service) {
		s.Spec.Ports = []corev1.ServicePort{{Name: "dns", Port: 81, Protocol: corev1.ProtocolUDP}}
	})
	old := udpSlice("dns", n.pods["a"].ip.String())
	p.OnService(nil, svc)
	p.OnEndpointSlice(nil, old)
	p.OnSynced()

	var conn net.Conn
	if err := netnsutil.Do(n.pods["c"].ns, func() (err error) { conn, err = net.Dial("udp", "10.96.0.53:81"); return err }); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ask := func() string {
		_ = conn.SetDeadline(time.Now().Add(200 * time.Millisecond))
		if _, err := conn.Write([]byte("ping")); err != nil {
			return ""
		}
		buf := make([]byte, 512)
		k, err := conn.Read(buf)
		if err != nil {
			return ""
		}
		return strings.Fields(string(buf[:k]))[0]
	}
	testutil.Eventually(t, 10*time.Second, "the first UDP answer from a", func() bool { return ask() == "a" })
	p.OnEndpointSlice(old, udpSlice("dns", n.pods["b"].ip.String()))
	testutil.Eventually(t, 10*time.Second, "the same UDP socket answered by b", func() bool { return ask() == "b" })
}

// TestHealthCheckNodePort: 200 with the local endpoint count, 503 without.
func TestHealthCheckNodePort(t *testing.T) {
	n := newNode(t, "a")
	p := runProxier(t, n)
	svc := service("local", "10.96.0.12", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer // health-check node ports are a LoadBalancer feature
		s.Spec.Ports = s.Spec.Ports[:1]
		s.Spec.Ports[0].NodePort = 30081
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		s.Spec.HealthCheckNodePort = 32001
	})
	withLocal := slice("local", n.local("a"))
	p.OnService(nil, svc)
	p.OnEndpointSlice(nil, withLocal)
	p.OnSynced()
	health := func() (int, int) {
		c := &http.Client{Timeout: time.Second, Transport: &http.Transport{DialContext: netnsutil.Dialer(n.ext, nil)}}
		resp, err := c.Get("http://" + nodeIP + ":32001/")
		if err != nil {
			return 0, -1
		}
		defer resp.Body.Close()
		var body struct {
			LocalEndpoints int `json:"localEndpoints"`
			Service        struct{ Namespace, Name string }
		}
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, body.LocalEndpoints
	}
	testutil.Eventually(t, 10*time.Second, "health check 200 with 1 local endpoint", func() bool { code, k := health(); return code == 200 && k == 1 })
	p.OnEndpointSlice(withLocal, slice("local", endpoint{remoteEP, otherNode}))
	testutil.Eventually(t, 10*time.Second, "health check 503 with 0 local endpoints", func() bool { code, k := health(); return code == 503 && k == 0 })
}

func slogDiscard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
