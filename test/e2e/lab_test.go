// Package e2e runs weft on a lab: a real kube-apiserver and
// kube-controller-manager, nodes as network namespaces, real packets.
package e2e

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/internal/nlutil"
	"github.com/weftnet/weft/internal/proc"
	"github.com/weftnet/weft/internal/testutil"
	"github.com/weftnet/weft/lab"
	"github.com/weftnet/weft/lab/check"
	"github.com/weftnet/weft/routing"
)

func TestMain(m *testing.M) { os.Exit(netnsutil.RunTests(m)) }

// binDir is the repository's bin/, which `make build kube` fills.
func binDir(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		dir = filepath.Dir(dir)
		if dir == "/" {
			t.Fatal("no go.mod above the working directory")
		}
	}
	bin := filepath.Join(dir, "bin")
	for _, b := range []string{"weftctl", "weft-agent", "weft-workload", "cni/weft", "cni/portmap", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kubelet", "node/containerd", "images/pause.oci.tar", lab.ImageArchive} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			t.Fatalf("%s missing: run `make build kube image node` first", filepath.Join(bin, b))
		}
	}
	return bin
}

// cluster is a running lab and an admin client for it.
type cluster struct {
	dir    string
	state  *lab.State
	client kubernetes.Interface
	// before is the machine as lab up found it: the kubelets' host-wide
	// kernel settings, and which of the nodes' machine paths existed.
	before map[string]string
}

// machineState reads what a lab must leave as it found it.
func machineState(o lab.Options) map[string]string {
	out := map[string]string{}
	for _, s := range lab.KubeletSysctls() {
		b, _ := os.ReadFile(s)
		out[s] = strings.TrimSpace(string(b))
	}
	for _, p := range lab.MachinePaths(o) {
		_, err := os.Stat(p)
		out[p] = fmt.Sprint(err == nil)
	}
	return out
}

func up(t *testing.T, nodes int, mode string) *cluster {
	t.Helper()
	return upOptions(t, lab.Options{Nodes: nodes, Routing: mode})
}

// upOptions brings a lab up with o (its directory, binaries, API port and
// output filled in).
func upOptions(t *testing.T, o lab.Options) *cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("lab test: skipped with -short")
	}
	if !netnsutil.Isolated() {
		t.Skip("lab test: needs root to run in a private network namespace")
	}
	dir := filepath.Join(t.TempDir(), "lab")
	// Another test binary on the machine (another package, a benchmark)
	// may hold the machine's lab.
	turnCtx, cancelTurn := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancelTurn()
	done, err := lab.WaitTurn(turnCtx)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var progress strings.Builder
	o.Dir, o.BinDir, o.APIPort, o.Out = dir, binDir(t), 6443, &progress
	before := machineState(o)
	err = lab.Up(ctx, o)
	t.Cleanup(func() {
		defer done()
		if t.Failed() {
			dumpLogs(t, dir)
		}
		if err := lab.Down(dir); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	if err != nil {
		t.Fatalf("lab up: %v\n%s", err, progress.String())
	}
	st, err := lab.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	c, err := lab.Client(lab.AdminKubeconfig(dir))
	if err != nil {
		t.Fatal(err)
	}
	return &cluster{dir: dir, state: st, client: c, before: before}
}

func dumpLogs(t *testing.T, dir string) {
	logs, _ := filepath.Glob(filepath.Join(dir, "logs", "*.log"))
	// weft's own pods: the containers' logs on each node.
	for _, l := range append(logs, lab.PodLogs(dir, "weft-system")...) {
		b, _ := os.ReadFile(l)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) > 15 {
			lines = lines[len(lines)-15:]
		}
		t.Logf("--- %s (tail)\n%s", filepath.Base(l), strings.Join(lines, "\n"))
	}
}

func (c *cluster) node(name string) lab.Member {
	for _, m := range c.state.Members {
		if m.Name == name {
			return m
		}
	}
	panic("no lab member " + name)
}

// mustCheck runs weftctl check's probes and fails on any failed row or
// on a kind of row it did not run.
func (c *cluster) mustCheck(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	results, err := check.Run(ctx, c.state, c.client, false)
	if err != nil {
		t.Fatalf("check: %v", err)
	}
	kinds := map[string]int{}
	for _, r := range results {
		kinds[r.Kind]++
		if !r.OK {
			t.Errorf("check %s %s -> %s: %s", r.Kind, r.From, r.To, r.Detail)
		}
	}
	for _, k := range []string{"pod to pod, same node", "pod to pod, other node", "node to pod", "pod to node", "pod to external (masqueraded)", "pod to cluster DNS",
		"pod to ClusterIP", "node to ClusterIP", "external to NodePort (SNAT)",
		"policy: denied pod, same node", "policy: denied pod, other node", "policy: allowed pod, other node",
		"policy: node to its isolated pod", "policy: deleted policy lifts isolation",
		"MTU: pod to pod, other node", "MTU: pod to ClusterIP, backend on other node", "MTU: external to NodePort, backend on other node"} {
		if kinds[k] == 0 {
			t.Errorf("check ran no %q probe", k)
		}
	}
}

// ownedRoutes lists the weft routes in a node's namespace, by destination.
func ownedRoutes(t *testing.T, m lab.Member) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	err := netnsutil.Do(m.NSPath(), func() error {
		routes, err := nlutil.Dump("routes", func() ([]netlink.Route, error) {
			return netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Protocol: routing.RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
		})
		for _, r := range routes {
			if r.Dst != nil {
				out[r.Dst.String()] = true
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// fdbEntries lists the permanent FDB entries on a node's VXLAN device.
func fdbEntries(t *testing.T, m lab.Member) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	err := netnsutil.Do(m.NSPath(), func() error {
		l, err := netlink.LinkByName(routing.DefaultDevice)
		if err != nil {
			return err
		}
		neighs, err := nlutil.Dump("fdb", func() ([]netlink.Neigh, error) { return netlink.NeighList(l.Attrs().Index, unix.AF_BRIDGE) })
		for _, n := range neighs {
			if n.IP != nil {
				out[n.IP.String()] = true
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func podCIDR(t *testing.T, c *cluster, node string) string {
	t.Helper()
	n, err := c.client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Spec.PodCIDR
}

// TestLab brings a 3-node lab up in each routing mode, proves connectivity,
// survives bad Node objects, drops a deleted node's routes within 2 s and
// leaves nothing behind.
func TestLab(t *testing.T) {
	for _, mode := range []string{"hostgw", "vxlan"} {
		t.Run(mode, func(t *testing.T) {
			c := up(t, 3, mode)
			c.mustCheck(t)

			addBadNodes(t, c)
			c.mustCheck(t)
			if mode == "hostgw" {
				kubeletRestart(t, c, "node2")
			}

			gone := podCIDR(t, c, "node3")
			n1 := c.node("node1")
			if !ownedRoutes(t, n1)[gone] {
				t.Fatalf("node1 has no route to node3's %s", gone)
			}
			if mode == "vxlan" && !fdbEntries(t, n1)[c.node("node3").IP.String()] {
				t.Fatalf("node1 has no FDB entry towards node3")
			}
			if err := c.client.CoreV1().Nodes().Delete(context.Background(), "node3", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(2 * time.Second)
			for _, m := range []lab.Member{n1, c.node("node2")} {
				for ownedRoutes(t, m)[gone] || (mode == "vxlan" && fdbEntries(t, m)[c.node("node3").IP.String()]) {
					if time.Now().After(deadline) {
						t.Fatalf("%s still routes to deleted node3 (%s) 2s after the deletion", m.Name, gone)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}

			if err := lab.Down(c.dir); err != nil {
				t.Fatal(err)
			}
			c.assertNothingLeft(t)
		})
	}
}

// addBadNodes registers Nodes a broken controller could produce; the agents
// must skip them (logging the node) and keep every other route.
func addBadNodes(t *testing.T, c *cluster) {
	t.Helper()
	bad := []*corev1.Node{
		{ObjectMeta: metav1.ObjectMeta{Name: "bad-overlap"}, Spec: corev1.NodeSpec{PodCIDR: podCIDR(t, c, "node1"), PodCIDRs: []string{podCIDR(t, c, "node1")}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "bad-address"}, Spec: corev1.NodeSpec{PodCIDR: "10.250.0.0/24", PodCIDRs: []string{"10.250.0.0/24"}}},
	}
	for _, n := range bad {
		if _, err := c.client.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating node %s: %v", n.Name, err)
		}
	}
	patch := []byte(`{"status":{"addresses":[{"type":"InternalIP","address":"not-an-ip"}]}}`)
	if _, err := c.client.CoreV1().Nodes().Patch(context.Background(), "bad-address", types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatalf("patching bad-address: %v", err)
	}
	// Give the agents a sync with the bad nodes before checking.
	testutil.Eventually(t, 5*time.Second, "node1's agent logging the node with an unparseable address",
		func() bool { return logged(c.dir, "node1-agent", "bad-address") })
	testutil.Eventually(t, 5*time.Second, "node1's agent logging the node with an overlapping podCIDR",
		func() bool { return logged(c.dir, "node1-agent", "bad-overlap") })
}

func logged(dir, daemon, s string) bool {
	path := filepath.Join(dir, "logs", daemon+".log")
	if node, ok := strings.CutSuffix(daemon, "-agent"); ok {
		path = lab.AgentLog(dir, node)
	}
	b, _ := os.ReadFile(path)
	return strings.Contains(string(b), s)
}

// kubeletRestart stops a node's kubelet as a crash would: the control
// plane reports the node NotReady, lab status names the dead daemon, and
// once the kubelet is started again the node is Ready.
func kubeletRestart(t *testing.T, c *cluster, node string) {
	t.Helper()
	daemon := node + "-kubelet"
	pid, ok := lab.PID(c.dir, daemon)
	if !ok {
		t.Fatalf("%s is not running", daemon)
	}
	proc.Stop([]int{pid}, 0) // SIGKILL, without waiting for the exit
	testutil.Eventually(t, 10*time.Second, "lab status reporting the killed "+daemon+" dead", func() bool {
		for _, p := range lab.Procs(c.dir) {
			if p.Name == daemon {
				return !p.Running
			}
		}
		return false
	})
	ready := func(want corev1.ConditionStatus) func() bool {
		return func() bool {
			n, err := c.client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
			if err != nil {
				return false
			}
			for _, cond := range n.Status.Conditions {
				if cond.Type == corev1.NodeReady {
					return cond.Status == want
				}
			}
			return false
		}
	}
	testutil.Eventually(t, 2*time.Minute, node+" reported not ready after its kubelet died", func() bool { return !ready(corev1.ConditionTrue)() })
	if err := lab.Restart(c.dir, daemon); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 2*time.Minute, node+" ready again after its kubelet restarted", ready(corev1.ConditionTrue))
}

// assertNothingLeft checks that lab down left the machine as lab up found
// it: no lab namespace, process in a lab cgroup, lab dir, mount point the
// lab made, or changed kernel setting.
func (c *cluster) assertNothingLeft(t *testing.T) {
	t.Helper()
	dir := c.dir
	if now := machineState(c.state.Options); !maps.Equal(now, c.before) {
		t.Errorf("the machine after lab down %v, before lab up %v", now, c.before)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	for _, f := range procs {
		pid, _ := strconv.Atoi(strings.Split(f, "/")[2])
		// A zombie keeps its cgroup until reaped, and the lab's
		// daemons' parent is PID 1, which may not reap (docs/lab.md).
		if b, err := os.ReadFile(f); err == nil && strings.Contains(string(b), "/"+lab.NSPrefix) && proc.Running(pid) {
			t.Errorf("a process in a lab cgroup after lab down (%s): %s", f, b)
		}
	}
	entries, _ := os.ReadDir(netnsutil.RunDir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), lab.NSPrefix) {
			t.Errorf("namespace %s left after lab down", e.Name())
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("lab dir %s left after lab down: %v", dir, err)
	}
}

// TestAgentRestartKeepsStream kills and restarts weft-agent on both ends of
// a long-lived cross-node TCP stream; the stream must carry data throughout.
func TestAgentRestartKeepsStream(t *testing.T) {
	c := up(t, 2, "vxlan")
	ctx := context.Background()
	pods := map[string]*corev1.Pod{}
	for _, node := range []string{"node1", "node2"} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "stream-" + node},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "w", Image: lab.WorkloadImage}}}}
		if _, err := c.client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pods[node] = waitRunning(t, c, "default", p.Name)
	}
	src := c.podNS(t, pods["node1"])
	var conn net.Conn
	if err := netnsutil.Do(src, func() (err error) {
		conn, err = net.DialTimeout("tcp", net.JoinHostPort(pods["node2"].Status.PodIP, "81"), 3*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	exchange := func(msg string) {
		t.Helper()
		_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := fmt.Fprintln(conn, msg); err != nil {
			t.Fatalf("stream write %q: %v", msg, err)
		}
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatalf("stream read after %q: %v", msg, err)
		}
	}
	exchange("hello")
	for _, d := range []string{"node1-agent", "node2-agent"} {
		before, _ := lab.PID(c.dir, d)
		if err := lab.Restart(c.dir, d); err != nil {
			t.Fatal(err)
		}
		if after, ok := lab.PID(c.dir, d); !ok || after == before {
			t.Fatalf("%s was not restarted (pid %d, then %d)", d, before, after)
		}
		exchange("during restart of " + d)
	}
	// A restarted agent's /healthz turns 200 only after its first full sync
	// (routes re-applied): the stream must have lived through both.
	for _, n := range []string{"node1", "node2"} {
		url := fmt.Sprintf("http://%s:%d/healthz", c.node(n).IP, lab.AgentPort)
		waitHealthy(t, c.node(n).NSPath(), url)
	}
	for i := 0; i < 5; i++ {
		exchange(fmt.Sprintf("after restart %d", i))
	}
}

// waitHealthy polls url from the namespace at nsPath until it answers 200.
func waitHealthy(t *testing.T, nsPath, url string) {
	t.Helper()
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DialContext: netnsutil.Dialer(nsPath, nil), DisableKeepAlives: true}}
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not healthy: %v", url, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitRunning(t *testing.T, c *cluster, ns, name string) *corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		p, err := c.client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s/%s not running: %v %+v", ns, name, err, p.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestOneNode runs, on one 1-node lab, what needs an API server and a
// node but not traffic between nodes (a lab up and down costs about 40 s).
func TestOneNode(t *testing.T) {
	c := up(t, 1, "hostgw")
	t.Run("AgentRBAC", func(t *testing.T) { agentRBAC(t, c) })
	t.Run("DeployDryRun", func(t *testing.T) { deployDryRun(t, c) })
}

// agentRBAC: the agent's identity can do its job and nothing more.
func agentRBAC(t *testing.T, c *cluster) {
	a, err := lab.Client(filepath.Join(c.dir, "node1-agent.kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	allowed := map[string]func() error{
		"list nodes":          func() error { _, err := a.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); return err },
		"list endpointslices": func() error { _, err := a.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{}); return err },
		"list services":       func() error { _, err := a.CoreV1().Services("").List(ctx, metav1.ListOptions{}); return err },
		"list networkpolicies": func() error {
			_, err := a.NetworkingV1().NetworkPolicies("").List(ctx, metav1.ListOptions{})
			return err
		},
		"annotate own node": func() error {
			_, err := a.CoreV1().Nodes().Patch(ctx, "node1", types.StrategicMergePatchType, []byte(`{"metadata":{"annotations":{"weft.dev/probe":"x"}}}`), metav1.PatchOptions{})
			return err
		},
		// The agents elect the writer of the ClusterNetworkPolicies'
		// status with it (the node's agent holds it by now).
		"read the status lease": func() error {
			var err error
			for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(time.Second) {
				if _, err = a.CoordinationV1().Leases("weft-system").Get(ctx, "weft-cluster-policy-status", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
					break
				}
			}
			return err
		},
	}
	refused := map[string]func() error{
		"read secrets": func() error { _, err := a.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{}); return err },
		"create pods": func() error {
			_, err := a.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "x"},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "x", Image: "x"}}}}, metav1.CreateOptions{})
			return err
		},
		"delete nodes":    func() error { return a.CoreV1().Nodes().Delete(ctx, "node1", metav1.DeleteOptions{}) },
		"list configmaps": func() error { _, err := a.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{}); return err },
		// The kubelets' heartbeats.
		"read a node's lease": func() error {
			_, err := a.CoordinationV1().Leases("kube-node-lease").Get(ctx, "node1", metav1.GetOptions{})
			return err
		},
	}
	for name, f := range allowed {
		if err := f(); err != nil {
			t.Errorf("agent should be allowed to %s: %v", name, err)
		}
	}
	for name, f := range refused {
		if err := f(); !apierrors.IsForbidden(err) {
			t.Errorf("agent should be refused to %s: got %v", name, err)
		}
	}
}
