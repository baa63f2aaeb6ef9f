package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/internal/nlutil"
	"github.com/weftnet/weft/internal/testutil"
	"github.com/weftnet/weft/lab"
	"github.com/weftnet/weft/topology"
)

// tinyPodCIDR makes each node's podCIDR a /29: the network address, the
// gateway and the broadcast address leave 5 pod addresses.
const (
	tinyPodCIDR  = 29
	tinyPodIPs   = 5
	limitMbit    = 40  // the shaped pod's weft.dev/bandwidth
	rateMargin   = 0.1 // a shaped transfer stays within ±10 % of its limit
	transferTime = 3 * time.Second
)

// TestTopologyExporter runs the exporter on a 2-node lab with tiny
// podCIDRs: what it publishes, its taint steering the stock scheduler,
// bandwidth scheduled and enforced, and the agent's RBAC for all of it.
func TestTopologyExporter(t *testing.T) {
	c := upOptions(t, lab.Options{Nodes: 2, Routing: "hostgw", PodCIDRSize: tinyPodCIDR})
	published(t, c)
	agentRBACForTopology(t, c)
	podIPsExhaustion(t, c)
	bandwidth(t, c)
}

func getNode(t *testing.T, c *cluster, name string) *corev1.Node {
	t.Helper()
	n, err := c.client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// published: every node carries its pod address capacity and bandwidth
// in capacity and allocatable, its routing and MTU, and node1 a warning
// event that the kubelet's maxPods exceeds its podCIDR.
func published(t *testing.T, c *cluster) {
	t.Helper()
	for _, name := range []string{"node1", "node2"} {
		testutil.Eventually(t, 30*time.Second, name+" publishing weft.dev/pod-ips and its topology", func() bool {
			n := getNode(t, c, name)
			capIPs, allocIPs := n.Status.Capacity[topology.PodIPsResource], n.Status.Allocatable[topology.PodIPsResource]
			return capIPs.Value() == tinyPodIPs && allocIPs.Value() == tinyPodIPs &&
				n.Labels[topology.RoutingLabel] == "hostgw" && n.Annotations[topology.MTUAnnotation] != ""
		})
	}
	n := getNode(t, c, "node1")
	if bw, ok := n.Status.Capacity[topology.BandwidthResource]; !ok || bw.Value() <= 2*limitMbit {
		t.Fatalf("node1's weft.dev/bandwidth is %v (present %v): want the uplink veth's speed", bw.String(), ok)
	}
	if q := n.Status.Capacity[corev1.ResourcePods]; q.Value() != 110 {
		t.Fatalf("the kubelet's pods capacity %s was changed, want 110", q.String())
	}
	testutil.Eventually(t, 10*time.Second, "a warning event that node1's maxPods exceeds its podCIDR", func() bool {
		evs, err := c.client.CoreV1().Events("").List(context.Background(), metav1.ListOptions{FieldSelector: fields.Set{
			"involvedObject.kind": "Node", "involvedObject.name": "node1", "reason": "PodCIDRSmallerThanMaxPods"}.String()})
		return err == nil && len(evs.Items) > 0 && evs.Items[0].Type == corev1.EventTypeWarning &&
			strings.Contains(evs.Items[0].Message, fmt.Sprintf("hold %d", tinyPodIPs))
	})
}

// agentRBACForTopology: the agent's service account (deploy/agent/rbac.yaml
// as the lab applies it) can read and write what the exporter writes,
// and no more than that around it.
func agentRBACForTopology(t *testing.T, c *cluster) {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", lab.AdminKubeconfig(c.dir))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Impersonate.UserName = "system:serviceaccount:weft-system:weft-agent"
	a, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	nodes := a.CoreV1().Nodes()
	n := getNode(t, c, "node1")
	allowed := map[string]func() error{
		"read node capacity": func() error { _, err := nodes.Get(ctx, "node1", metav1.GetOptions{}); return err },
		"patch node status resources": func() error {
			_, err := nodes.Patch(ctx, "node1", types.MergePatchType, []byte(`{"status":{"capacity":{"weft.dev/pod-ips":"5"}}}`), metav1.PatchOptions{}, "status")
			return err
		},
		"patch node taints": func() error {
			_, err := nodes.Patch(ctx, "node1", types.MergePatchType, taintsPatch(t, n.Spec.Taints), metav1.PatchOptions{})
			return err
		},
		"list the node's pods": func() error {
			_, err := a.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=node1"})
			return err
		},
		"record a node event": func() error {
			_, err := a.CoreV1().Events("default").Create(ctx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: "node1."},
				InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: "node1"}, Reason: "Probe", Type: corev1.EventTypeNormal}, metav1.CreateOptions{})
			return err
		},
	}
	refused := map[string]func() error{
		"delete pods": func() error { return a.CoreV1().Pods("default").Delete(ctx, "any", metav1.DeleteOptions{}) },
		"patch pods": func() error {
			_, err := a.CoreV1().Pods("default").Patch(ctx, "any", types.MergePatchType, []byte(`{}`), metav1.PatchOptions{})
			return err
		},
		"delete nodes": func() error { return nodes.Delete(ctx, "node1", metav1.DeleteOptions{}) },
		"read events":  func() error { _, err := a.CoreV1().Events("default").List(ctx, metav1.ListOptions{}); return err },
		"create namespaces": func() error {
			_, err := a.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{}, metav1.CreateOptions{})
			return err
		},
	}
	for name, f := range allowed {
		if err := f(); err != nil {
			t.Errorf("the agent should be allowed to %s: %v", name, err)
		}
	}
	for name, f := range refused {
		if err := f(); !apierrors.IsForbidden(err) {
			t.Errorf("the agent should be refused to %s: got %v", name, err)
		}
	}
}

// podIPsExhaustion: a deployment of more pods than node1's podCIDR holds,
// preferring node1. While node2 is held out of scheduling, node1 fills
// up, gets tainted, and the pods beyond its addresses stay unscheduled
// (never bound to node1, where they could not start); once node2 is
// open they run there. Deleting the pods lifts the taint.
func podIPsExhaustion(t *testing.T, c *cluster) {
	t.Helper()
	ctx := context.Background()
	hold := corev1.Taint{Key: "e2e.weft.dev/hold", Effect: corev1.TaintEffectNoSchedule}
	setTaints := func(name string, taints []corev1.Taint) {
		t.Helper()
		if _, err := c.client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, taintsPatch(t, taints), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setTaints("node2", []corev1.Taint{hold})

	sel := map[string]string{"app": "fill"}
	replicas := int32(1)
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "fill"}, Spec: appsv1.DeploymentSpec{
		Replicas: &replicas, Selector: &metav1.LabelSelector{MatchLabels: sel},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: sel}, Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "app", Image: lab.WorkloadImage}},
			Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{
				Weight: 100, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{
					Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{"node1"}}}}}}}},
		}},
	}}
	if _, err := c.client.AppsV1().Deployments("default").Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	scale := func(n int32) {
		t.Helper()
		p := []byte(fmt.Sprintf(`{"spec":{"replicas":%d}}`, n))
		if _, err := c.client.AppsV1().Deployments("default").Patch(ctx, "fill", types.MergePatchType, p, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	list := func() []corev1.Pod {
		t.Helper()
		l, err := c.client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(sel).String()})
		if err != nil {
			t.Fatal(err)
		}
		return l.Items
	}
	running := func() map[string]int {
		out := map[string]int{}
		for _, p := range list() {
			if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
				out[p.Spec.NodeName]++
			}
		}
		return out
	}
	// Pods of the lab's own (weft's Deployments) may hold some of node1's
	// addresses: the fill pods get the rest.
	all, err := c.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=node1"})
	if err != nil {
		t.Fatal(err)
	}
	held := 0
	for _, p := range all.Items {
		if !p.Spec.HostNetwork && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			held++
		}
	}
	fill := int32(tinyPodIPs - held)
	if fill < 1 {
		t.Fatalf("node1's %d pod addresses are all held by the lab's own pods", tinyPodIPs)
	}
	// One more pod at a time: the stock scheduler counts no pod addresses,
	// so only the taint keeps it away, and the taint follows a binding
	// within the exporter's reaction time, not within the scheduler's.
	for n := int32(1); n <= fill; n++ {
		scale(n)
		testutil.Eventually(t, 30*time.Second, fmt.Sprintf("%d fill pods running on node1", n), func() bool { return running()["node1"] == int(n) })
	}
	testutil.Eventually(t, 30*time.Second, "node1 tainted with its podCIDR full", func() bool { return topology.Tainted(getNode(t, c, "node1")) })

	scale(fill + 2)
	// The scheduler names no taint in its message; node1's only taint is
	// weft's (checked above and below), node2's the hold.
	testutil.Eventually(t, 30*time.Second, "the pods beyond node1's addresses unschedulable for the nodes' taints", func() bool {
		waiting := 0
		for _, p := range list() {
			for _, cond := range p.Status.Conditions {
				if p.Spec.NodeName == "" && cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse &&
					strings.Contains(cond.Message, "2 node(s) had untolerated taint") {
					waiting++
				}
			}
		}
		return waiting == 2
	})
	if taints := getNode(t, c, "node1").Spec.Taints; len(taints) != 1 || taints[0].Key != topology.ExhaustedTaint || taints[0].Effect != corev1.TaintEffectNoSchedule {
		t.Fatalf("node1's taints %v, want only %s:NoSchedule", taints, topology.ExhaustedTaint)
	}
	if got := running(); got["node1"] != int(fill) || got["node2"] != 0 {
		t.Fatalf("running fill pods per node %v, want %d on node1 only", got, fill)
	}
	for _, p := range list() {
		if p.Spec.NodeName == "node1" && p.Status.Phase != corev1.PodRunning {
			t.Fatalf("pod %s was bound to the full node1: %s", p.Name, p.Status.Phase)
		}
	}

	setTaints("node2", nil)
	testutil.Eventually(t, 30*time.Second, "the remaining fill pods running on node2", func() bool {
		got := running()
		return got["node1"] == int(fill) && got["node2"] == 2
	})
	if !topology.Tainted(getNode(t, c, "node1")) {
		t.Fatal("node1 lost its taint while full")
	}

	if err := c.client.AppsV1().Deployments("default").Delete(ctx, "fill", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "node1's taint lifted after its pods were deleted", func() bool { return !topology.Tainted(getNode(t, c, "node1")) })
	testutil.Eventually(t, 30*time.Second, "the fill pods gone", func() bool { return len(list()) == 0 })
}

// bandwidth: requests of weft.dev/bandwidth are scheduled against the
// nodes' bandwidth and enforced on the pods' veths.
func bandwidth(t *testing.T, c *cluster) {
	t.Helper()
	ctx := context.Background()
	capacity := getNode(t, c, "node1").Status.Capacity[topology.BandwidthResource]
	bwPod := func(name, node string, mbit int64) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "w", Image: lab.WorkloadImage}}}}
		if node != "" {
			p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": node}
		}
		if mbit != 0 {
			q := *resource.NewQuantity(mbit, resource.DecimalSI)
			p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{topology.BandwidthResource: q}
		}
		return p
	}
	create := func(p *corev1.Pod) error {
		_, err := c.client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
		return err
	}
	// Malformed requests never reach the node: the API refuses them.
	bad := bwPod("bw-fraction", "", 0)
	bad.Spec.Containers[0].Resources.Limits = corev1.ResourceList{topology.BandwidthResource: resource.MustParse("1500m")}
	if err := create(bad); !apierrors.IsInvalid(err) {
		t.Fatalf("a fractional weft.dev/bandwidth request: got %v, want the API to refuse it", err)
	}

	for _, p := range []*corev1.Pod{
		bwPod("bw-limited", "node1", limitMbit),
		bwPod("bw-free", "node1", 0),
		bwPod("bw-big", "", capacity.Value()-limitMbit+1), // fits node2 only, once bw-limited holds node1's
		bwPod("bw-huge", "", capacity.Value()+1),          // fits nowhere
	} {
		if err := create(p); err != nil {
			t.Fatal(err)
		}
		if p.Name == "bw-limited" {
			waitRunning(t, c, "default", p.Name)
		}
	}
	limited, free := waitRunning(t, c, "default", "bw-limited"), waitRunning(t, c, "default", "bw-free")
	if big := waitRunning(t, c, "default", "bw-big"); big.Spec.NodeName != "node2" {
		t.Fatalf("bw-big runs on %s, whose bandwidth left is below its request", big.Spec.NodeName)
	}
	testutil.Eventually(t, 30*time.Second, "bw-huge unschedulable for its bandwidth", func() bool {
		p, err := c.client.CoreV1().Pods("default").Get(ctx, "bw-huge", metav1.GetOptions{})
		if err != nil || p.Spec.NodeName != "" {
			return false
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && strings.Contains(cond.Message, "Insufficient "+string(topology.BandwidthResource)) {
				return true
			}
		}
		return false
	})

	node1 := c.node("node1")
	nodeIP := node1.IP
	podNS := func(p *corev1.Pod) string { return c.podNS(t, p) }
	within := func(what string, got float64) {
		t.Helper()
		if got < limitMbit*(1-rateMargin) || got > limitMbit*(1+rateMargin) {
			t.Errorf("%s: %.1f Mbit/s, want %d Mbit/s ±%.0f%%", what, got, limitMbit, rateMargin*100)
		} else {
			t.Logf("%s: %.1f Mbit/s (limit %d)", what, got, limitMbit)
		}
	}
	testutil.Eventually(t, 10*time.Second, "bw-limited's IFB on node1", func() bool { return len(ifbs(t, node1.NSPath())) == 1 })
	within("bw-limited to node1 (pod egress)", transferMbit(t, podNS(limited), node1.NSPath(), nodeIP))
	podIP := netip.MustParseAddr(limited.Status.PodIP)
	within("node1 to bw-limited (pod ingress)", transferMbit(t, node1.NSPath(), podNS(limited), podIP))
	if got := transferMbit(t, podNS(free), node1.NSPath(), nodeIP); got < 2*limitMbit {
		t.Errorf("bw-free, which requests no bandwidth, sent at %.1f Mbit/s: limited", got)
	} else {
		t.Logf("bw-free to node1 (unlimited): %.1f Mbit/s", got)
	}

	for _, name := range []string{"bw-limited", "bw-free", "bw-big", "bw-huge"} {
		if err := c.client.CoreV1().Pods("default").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 30*time.Second, "bw-limited's IFB removed from node1", func() bool { return len(ifbs(t, node1.NSPath())) == 0 })
}

// taintsPatch sets a node's taints to taints.
func taintsPatch(t *testing.T, taints []corev1.Taint) []byte {
	t.Helper()
	if taints == nil {
		taints = []corev1.Taint{}
	}
	b, err := json.Marshal(map[string]any{"spec": map[string]any{"taints": taints}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// ifbs lists weft's IFB devices in a node's namespace.
func ifbs(t *testing.T, nsPath string) []string {
	t.Helper()
	var out []string
	err := netnsutil.Do(nsPath, func() error {
		links, err := nlutil.Dump("links", netlink.LinkList)
		for _, l := range links {
			if l.Type() == "ifb" && strings.HasPrefix(l.Attrs().Name, topology.IFBPrefix) {
				out = append(out, l.Attrs().Name)
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// transferMbit sends as fast as TCP goes from a socket in fromNS to a
// listener on to in toNS for transferTime, and returns the rate the
// receiver saw after the first half second (the token bucket's initial
// burst and the queue filling up are left out). Bounded in time, and in
// size at 1 GiB.
func transferMbit(t *testing.T, fromNS, toNS string, to netip.Addr) float64 {
	t.Helper()
	var ln net.Listener
	if err := netnsutil.Do(toNS, func() (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort(to.String(), "0"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		mbit float64
		err  error
	}
	done := make(chan result, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		defer conn.Close()
		_ = conn.SetReadDeadline(time.Now().Add(transferTime + 10*time.Second))
		buf := make([]byte, 64<<10)
		var start, last time.Time
		var counted int64
		for {
			n, err := conn.Read(buf)
			now := time.Now()
			if start.IsZero() && n > 0 {
				start = now
			}
			if n > 0 && now.Sub(start) > 500*time.Millisecond {
				if last.IsZero() {
					last = now
				} else {
					counted += int64(n)
					last = now
				}
			}
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				done <- result{err: err}
				return
			}
		}
		first := start.Add(500 * time.Millisecond)
		if last.Sub(first) <= 0 {
			done <- result{err: errors.New("the transfer ended within half a second")}
			return
		}
		done <- result{mbit: float64(counted) * 8 / last.Sub(first).Seconds() / 1e6}
	}()
	var conn net.Conn
	if err := netnsutil.Do(fromNS, func() (err error) {
		conn, err = net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 64<<10)
	var sent int64
	_ = conn.SetWriteDeadline(time.Now().Add(transferTime))
	for end := time.Now().Add(transferTime); time.Now().Before(end) && sent < 1<<30; {
		n, err := conn.Write(chunk)
		sent += int64(n)
		if err != nil {
			break // the write deadline
		}
	}
	conn.Close()
	r := <-done
	if r.err != nil {
		t.Fatalf("transfer to %s: %v", to, r.err)
	}
	return r.mbit
}
