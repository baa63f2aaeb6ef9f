package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/lab"
)

// stream is a TCP connection to the lab workload's echo port that must
// keep answering.
type stream struct {
	name string
	conn net.Conn
	r    *bufio.Reader
}

func openStream(t *testing.T, c *cluster, name, nsPath, addr string) *stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := c.state.Dialer(nsPath)(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	t.Cleanup(func() { conn.Close() })
	s := &stream{name: name, conn: conn, r: bufio.NewReader(conn)}
	s.exchange(t, "hello")
	return s
}

func (s *stream) exchange(t *testing.T, msg string) {
	t.Helper()
	if _, err := s.try(msg, 3*time.Second); err != nil {
		t.Fatalf("%s: %v", s.name, err)
	}
}

// try sends a line and reads the answer within the bound, and returns how
// long that took.
func (s *stream) try(msg string, within time.Duration) (time.Duration, error) {
	start := time.Now()
	_ = s.conn.SetDeadline(start.Add(within))
	if _, err := fmt.Fprintln(s.conn, msg); err != nil {
		return 0, fmt.Errorf("write %q: %w", msg, err)
	}
	if _, err := s.r.ReadString('\n'); err != nil {
		return 0, fmt.Errorf("read after %q: %w", msg, err)
	}
	return time.Since(start), nil
}

// TestUpgradeAndUninstall rolls weft-agent's DaemonSet to another build of
// the image, node by node as users upgrade: a cross-node pod-to-pod stream
// and a connection through a ClusterIP stay up throughout, and a pod
// created during the rollout gets its network. Then it uninstalls weft as
// docs/deploy.md says (`kubectl delete -k`, then weft-agent --cleanup on
// every node): no weft rule, link, route or file is left on the nodes.
func TestUpgradeAndUninstall(t *testing.T) {
	c := up(t, 2, "vxlan")
	ctx := context.Background()
	app := map[string]string{"app": "roll"}
	server, _ := c.pod(t, "roll-server", "node2", app)
	_, clientNS := c.pod(t, "roll-client", "node1", nil)
	svc, err := c.client.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "roll"},
		Spec: corev1.ServiceSpec{Selector: app, Ports: []corev1.ServicePort{{Port: 81, TargetPort: intstr.FromInt32(81)}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.waitEndpoints(t, "roll", 1)
	direct := openStream(t, c, "pod-to-pod stream", clientNS, net.JoinHostPort(server.Status.PodIP, "81"))
	var viaService *stream
	for deadline := time.Now().Add(10 * time.Second); viaService == nil; {
		// The proxies sync within their min-sync-period of the slice.
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := c.state.Dialer(clientNS)(ctx, "tcp", net.JoinHostPort(svc.Spec.ClusterIP, "81"))
		cancel()
		if err == nil {
			conn.Close()
			viaService = openStream(t, c, "Service connection", clientNS, net.JoinHostPort(svc.Spec.ClusterIP, "81"))
		} else if time.Now().After(deadline) {
			t.Fatalf("ClusterIP: %v", err)
		}
	}

	goodConfig := badConfig(t, c, []*stream{direct, viaService})

	// The new build: the image under another tag.
	if err := c.state.TagWeftImage(ctx, "v2"); err != nil {
		t.Fatal(err)
	}
	before := agentPods(t, c)
	if _, err := lab.Kubectl(ctx, c.state, "-n", "weft-system", "set", "image", "daemonset/weft-agent",
		"agent="+lab.WeftImage+":v2", "install-cni="+lab.WeftImage+":v2", "sysctls="+lab.WeftImage+":v2"); err != nil {
		t.Fatal(err)
	}
	setConfigMap(t, c, goodConfig)
	// A pod created while the agents are being replaced.
	mid := c.podAsync(t, "roll-mid", "node1", nil)
	deadline := time.Now().Add(4 * time.Minute)
	for i := 0; ; i++ {
		direct.exchange(t, fmt.Sprintf("during rollout %d", i))
		viaService.exchange(t, fmt.Sprintf("during rollout %d", i))
		if rolled(t, c, before, lab.WeftImage+":v2") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the DaemonSet did not roll out to v2 within 4 minutes: %v", agentPods(t, c))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := lab.WaitAgents(ctx, c.client, 2); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		direct.exchange(t, fmt.Sprintf("after rollout %d", i))
		viaService.exchange(t, fmt.Sprintf("after rollout %d", i))
	}
	p := waitRunning(t, c, "default", mid)
	midNS := c.podNS(t, p)
	url := "http://" + net.JoinHostPort(server.Status.PodIP, "80") + "/"
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		r, err := c.fetch(midNS, url)
		if err == nil {
			if r.Client != p.Status.PodIP {
				t.Fatalf("the server saw %s, want the new pod's %s", r.Client, p.Status.PodIP)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a pod created during the rollout cannot reach another node's pod: %v", err)
		}
	}
	direct.conn.Close()
	viaService.conn.Close()
	uninstall(t, c)
}

// uninstall deletes the pods, then weft's objects, runs the agent's
// cleanup on every node and looks for anything weft left.
func uninstall(t *testing.T, c *cluster) {
	ctx := context.Background()
	if err := c.client.CoreV1().Pods("default").DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	waitNoPods(t, c, "default")
	if _, err := lab.Kubectl(ctx, c.state, "delete", "-k", filepath.Join(c.dir, "deploy-lab")); err != nil {
		t.Fatal(err)
	}
	waitNoPods(t, c, "weft-system")
	for _, m := range lab.NodeMembers(c.state.Members) {
		root := lab.NodeRoot(c.dir, m.Name)
		var out []byte
		err := netnsutil.Do(m.NSPath(), func() (err error) {
			out, err = exec.Command(filepath.Join(binDir(t), "weft-agent"), "--cleanup", "--node-name", m.Name,
				"--kubeconfig", filepath.Join(c.dir, m.Name+"-agent.kubeconfig"), "--routing", c.state.Routing,
				"--cni-conf-dir", filepath.Join(root, "etc/cni/net.d"), "--cni-bin-dir", filepath.Join(root, "opt/cni/bin"),
				"--ipam-data-dir", filepath.Join(root, "var/lib/weft/ipam")).CombinedOutput()
			return err
		})
		if err != nil {
			t.Fatalf("weft-agent --cleanup on %s: %v\n%s", m.Name, err, out)
		}
		if r := ownedRoutes(t, m); len(r) > 0 {
			t.Errorf("%s: weft routes left: %v", m.Name, r)
		}
		for _, cmd := range [][]string{{"iptables-legacy-save"}, {"iptables-nft-save"}, {"ip6tables-legacy-save"}, {"ip6tables-nft-save"}, {"ipset", "list", "-n"}, {"nft", "list", "tables"}, {"ip", "-o", "link"}} {
			if _, err := exec.LookPath(cmd[0]); err != nil {
				continue
			}
			var out []byte
			err := netnsutil.Do(m.NSPath(), func() (err error) {
				out, err = exec.Command(cmd[0], cmd[1:]...).CombinedOutput()
				return err
			})
			if err != nil {
				t.Fatalf("%s on %s: %v\n%s", cmd, m.Name, err, out)
			}
			for _, line := range strings.Split(string(out), "\n") {
				// The lab's own namespaces (weftlab-*) show in link listings.
				if strings.Contains(strings.ReplaceAll(strings.ToLower(line), "weftlab", ""), "weft") {
					t.Errorf("%s: %s left %q", m.Name, cmd[0], line)
				}
			}
		}
		for _, f := range []string{"etc/cni/net.d/10-weft.conflist", "opt/cni/bin/weft", "var/lib/weft/ipam"} {
			if _, err := os.Stat(filepath.Join(root, f)); err == nil {
				t.Errorf("%s: /%s left", m.Name, f)
			}
		}
	}
}

func waitNoPods(t *testing.T, c *cluster, ns string) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		pods, err := c.client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
		if err == nil && len(pods.Items) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pods left in %s: %v %v", ns, err, len(pods.Items))
		}
	}
}

// configMapOf is the agent ConfigMap the DaemonSet mounts.
func configMapOf(t *testing.T, c *cluster) string {
	t.Helper()
	ds, err := c.client.AppsV1().DaemonSets("weft-system").Get(context.Background(), "weft-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.Name == "config" && v.ConfigMap != nil {
			return v.ConfigMap.Name
		}
	}
	t.Fatal("weft-agent's DaemonSet mounts no config ConfigMap")
	return ""
}

// setConfigMap points the DaemonSet's config volume at ConfigMap name.
func setConfigMap(t *testing.T, c *cluster, name string) {
	t.Helper()
	ds, err := c.client.AppsV1().DaemonSets("weft-system").Get(context.Background(), "weft-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range ds.Spec.Template.Spec.Volumes {
		if v.Name == "config" {
			patch := fmt.Sprintf(`[{"op":"replace","path":"/spec/template/spec/volumes/%d/configMap/name","value":%q}]`, i, name)
			if _, err := lab.Kubectl(context.Background(), c.state, "-n", "weft-system", "patch", "daemonset", "weft-agent", "--type", "json", "-p", patch); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// badConfig rolls the agents to a ConfigMap with a key no flag has: the
// first replaced agent refuses to start naming the key, the rollout stops
// there (maxUnavailable 1), the other node keeps its agent, and the live
// connections keep answering. It returns the good ConfigMap's name.
func badConfig(t *testing.T, c *cluster, live []*stream) string {
	t.Helper()
	ctx := context.Background()
	good := configMapOf(t, c)
	cm, err := c.client.CoreV1().ConfigMaps("weft-system").Get(ctx, good, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bad := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "weft-agent-config-bad", Namespace: "weft-system"}, Data: map[string]string{"bogus-flag": "1"}}
	for k, v := range cm.Data {
		bad.Data[k] = v
	}
	if _, err := c.client.CoreV1().ConfigMaps("weft-system").Create(ctx, bad, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	before := agentPods(t, c)
	setConfigMap(t, c, bad.Name)
	refused := ""
	for deadline := time.Now().Add(2 * time.Minute); refused == ""; time.Sleep(200 * time.Millisecond) {
		for _, s := range live {
			s.exchange(t, "during the bad rollout")
		}
		for node := range before {
			if logged(c.dir, node+"-agent", `key \"bogus-flag\": unknown`) || logged(c.dir, node+"-agent", `key "bogus-flag": unknown`) {
				refused = node
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no agent refused the ConfigMap's unknown key bogus-flag within 2 minutes")
		}
	}
	// The rollout waits for the refusing pod: the other node keeps its
	// agent, and traffic keeps flowing.
	for i := 0; i < 15; i++ {
		for _, s := range live {
			s.exchange(t, fmt.Sprintf("while the rollout is stuck %d", i))
		}
		time.Sleep(200 * time.Millisecond)
	}
	now := agentPods(t, c)
	for node, pod := range before {
		if node != refused && now[node] != pod {
			t.Errorf("%s's agent was replaced (%s, was %s) while %s's refused its configuration", node, now[node], pod, refused)
		}
	}
	return good
}

// agentPods maps each node to its weft-agent pod's UID and image.
func agentPods(t *testing.T, c *cluster) map[string]string {
	t.Helper()
	pods, err := c.client.CoreV1().Pods("weft-system").List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=weft-agent"})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			out[p.Spec.NodeName] = string(p.UID) + " " + p.Spec.Containers[0].Image
		}
	}
	return out
}

// rolled reports whether every node runs a new, ready agent pod (of
// image, unless it is "").
func rolled(t *testing.T, c *cluster, before map[string]string, image string) bool {
	t.Helper()
	pods, err := c.client.CoreV1().Pods("weft-system").List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=weft-agent"})
	if err != nil {
		t.Fatal(err)
	}
	done := map[string]bool{}
	for _, p := range pods.Items {
		old := strings.HasPrefix(before[p.Spec.NodeName], string(p.UID)+" ")
		if !old && p.DeletionTimestamp == nil && (image == "" || p.Spec.Containers[0].Image == image) && podReady(&p) {
			done[p.Spec.NodeName] = true
		}
	}
	return len(done) == len(before)
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podAsync creates a lab workload pod without waiting for it to run.
func (c *cluster) podAsync(t *testing.T, name, node string, labels map[string]string) string {
	t.Helper()
	if _, err := c.client.CoreV1().Pods("default").Create(context.Background(), lab.WorkloadPod(name, node, labels), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return name
}
