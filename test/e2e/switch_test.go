package e2e

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/lab"
)

// TestProxyModeSwitch switches the proxy mode of a running eBPF lab by
// its agents' ConfigMap, as docs/deploy.md says (the eBPF overlay, whose
// agents can see and retire the eBPF mode's pins): through every pair of
// the three modes each way (eBPF to nftables, to iptables, to nftables,
// to eBPF, to iptables, to eBPF), each a rolling update. A pod's connection
// through a ClusterIP, a connection from outside to a NodePort and a
// pod-to-pod stream, opened before the first switch, answer during and
// after every switch, new connections reach the Service in each mode, and
// only the mode in force has its iptables chains or nftables table.
func TestProxyModeSwitch(t *testing.T) {
	c := upOptions(t, lab.Options{Nodes: 2, Routing: "hostgw", ProxyMode: "ebpf"})
	ctx := context.Background()
	app := map[string]string{"app": "switch"}
	server, _ := c.pod(t, "switch-server", "node2", app)
	_, clientNS := c.pod(t, "switch-client", "node1", nil)
	svc, err := c.client.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "switch"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: app,
			Ports: []corev1.ServicePort{{Port: 81, TargetPort: intstr.FromInt32(81), NodePort: 30181}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.waitEndpoints(t, "switch", 1)
	vip := net.JoinHostPort(svc.Spec.ClusterIP, "81")
	nodePort := net.JoinHostPort(c.node("node1").IP.String(), "30181")
	ext := c.node("ext").NSPath()
	reachable := func(ns, addr string) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			conn, err := c.state.Dialer(ns)(dctx, "tcp", addr)
			cancel()
			if err == nil {
				conn.Close()
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("a new connection to %s: %v", addr, err)
			}
		}
	}
	reachable(clientNS, vip)
	reachable(ext, nodePort)
	streams := []*stream{
		openStream(t, c, "pod-to-pod stream", clientNS, net.JoinHostPort(server.Status.PodIP, "81")),
		openStream(t, c, "a pod's connection through the ClusterIP", clientNS, vip),
		openStream(t, c, "a connection from outside to the NodePort", ext, nodePort),
	}
	for i, mode := range []string{"nftables", "iptables", "nftables", "ebpf", "iptables", "ebpf"} {
		before := agentPods(t, c)
		if err := c.state.Reinstall(ctx, "proxy-mode="+mode); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(4 * time.Minute)
		for j := 0; !rolled(t, c, before, ""); j++ {
			for _, s := range streams {
				s.exchange(t, fmt.Sprintf("switch %d to %s, during %d", i+1, mode, j))
			}
			if time.Now().After(deadline) {
				t.Fatalf("switch %d to %s: the agents did not roll within 4 minutes: %v", i+1, mode, agentPods(t, c))
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err := lab.WaitAgents(ctx, c.client, 2); err != nil {
			t.Fatal(err)
		}
		for _, s := range streams {
			s.exchange(t, fmt.Sprintf("after switch %d to %s", i+1, mode))
		}
		reachable(clientNS, vip)
		reachable(ext, nodePort)
		// The iptables mode's chains are there in iptables mode only, the
		// nftables mode's table in nftables mode only.
		for _, m := range lab.NodeMembers(c.state.Members) {
			var nat []byte
			var tableErr error
			if err := netnsutil.Do(m.NSPath(), func() (err error) {
				_, tableErr = exec.Command("nft", "list", "table", "inet", "weft").Output()
				nat, err = exec.Command("iptables-save", "-t", "nat").CombinedOutput()
				return err
			}); err != nil {
				t.Fatalf("%s: iptables-save: %v\n%s", m.Name, err, nat)
			}
			if has := strings.Contains(string(nat), "WEFT-SERVICES"); has != (mode == "iptables") {
				t.Errorf("after switch %d to %s, %s has the iptables mode's chains: %v", i+1, mode, m.Name, has)
			}
			if has := tableErr == nil; has != (mode == "nftables") {
				t.Errorf("after switch %d to %s, %s has the nftables mode's table inet weft: %v", i+1, mode, m.Name, has)
			}
		}
	}
}
