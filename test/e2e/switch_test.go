package e2e

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
// its agents' ConfigMap, as docs/deploy.md says: through every pair of
// the three modes each way (eBPF to nftables, to iptables, to nftables,
// to eBPF, to iptables, to eBPF), each a rolling update; then it leaves the
// eBPF mode in one rollout of the base DaemonSet (iptables mode, whose
// agents hold only CAP_BPF and the bpffs of the eBPF mode's needs). A
// pod's connection through a ClusterIP, a connection from outside to a
// NodePort and a pod-to-pod stream, opened before the first switch,
// answer during and after every switch, new connections reach the
// Service in each mode, and only the mode in force has its iptables chains
// or nftables table. After the last switch the eBPF mode's pins stay
// (retired) while a connection from outside it translated is open, and
// are gone from every node once it has closed.
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
	switchTo := func(step, mode string, reinstall func() error) {
		t.Helper()
		before := agentPods(t, c)
		if err := reinstall(); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(4 * time.Minute)
		for j := 0; !rolled(t, c, before, ""); j++ {
			for _, s := range streams {
				s.exchange(t, fmt.Sprintf("%s, during %d", step, j))
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the agents did not roll within 4 minutes: %v", step, agentPods(t, c))
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err := lab.WaitAgents(ctx, c.client, 2); err != nil {
			t.Fatal(err)
		}
		for _, s := range streams {
			s.exchange(t, "after "+step)
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
				t.Errorf("after %s, %s has the iptables mode's chains: %v", step, m.Name, has)
			}
			if has := tableErr == nil; has != (mode == "nftables") {
				t.Errorf("after %s, %s has the nftables mode's table inet weft: %v", step, m.Name, has)
			}
		}
	}
	for i, mode := range []string{"nftables", "iptables", "nftables", "ebpf", "iptables", "ebpf"} {
		switchTo(fmt.Sprintf("switch %d to %s", i+1, mode), mode, func() error { return c.state.Reinstall(ctx, "proxy-mode="+mode) })
	}

	// Out of eBPF in one rollout: the base DaemonSet.
	c.state.Options.ProxyMode = "iptables"
	switchTo("the base DaemonSet", "iptables", func() error { return c.state.Reinstall(ctx) })
	pins := func(node string) []string {
		entries, err := os.ReadDir(filepath.Join(lab.NodeBPFFS(c.state.Dir, node), "weft"))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		return names
	}
	// node1 translated the connection from outside: its per-packet
	// programs stay for it (retired: no frontend, no socket program).
	if got := pins("node1"); !slices.Contains(got, "weft_retired") || !slices.Contains(got, "weft_ct") || slices.Contains(got, "link_connect4") {
		t.Fatalf("node1's pins with the connection from outside open: %v; want the retired mark and weft_ct, no socket program's link", got)
	}
	for _, s := range streams {
		s.exchange(t, "before closing")
		s.conn.Close()
	}
	// The agents look every 30 s (a bound of 3 minutes against a hang).
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(time.Second) {
		left := map[string][]string{}
		for _, m := range lab.NodeMembers(c.state.Members) {
			if got := pins(m.Name); len(got) > 0 {
				left[m.Name] = got
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the eBPF mode's pins left 3 minutes after its last connection closed: %v", left)
		}
	}
	reachable(clientNS, vip)
	reachable(ext, nodePort)
}
