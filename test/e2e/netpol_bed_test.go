package e2e

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	cnpclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/internal/why"
	"github.com/weftnet/weft/kube"
	"github.com/weftnet/weft/lab"
	"github.com/weftnet/weft/policy"
	nt "github.com/weftnet/weft/policy/netpoltest"
	"github.com/weftnet/weft/policy/oracle"
)

// netpolBed is the upstream netpol bed (x/y/z × a/b/c) running on a lab.
type netpolBed struct {
	c       *cluster
	world   *nt.World // with the lab's pod addresses
	targets map[string]nt.Target
}

// newNetpolBed creates the bed's namespaces and pods, spreading each
// namespace's pods over the nodes so that both same-node (bridged) and
// cross-node (routed) pairs are probed.
func newNetpolBed(t *testing.T, c *cluster, nodes int) *netpolBed {
	t.Helper()
	ctx := context.Background()
	b := &netpolBed{c: c, world: nt.NewWorld(), targets: map[string]nt.Target{}}
	for _, n := range b.world.Namespaces {
		if _, err := c.client.CoreV1().Namespaces().Create(ctx, n.DeepCopy(), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := lab.WaitServiceAccount(ctx, c.client, n.Name); err != nil {
			t.Fatal(err)
		}
	}
	for i, p := range b.world.Pods {
		p.Spec.NodeName = fmt.Sprintf("node%d", 1+i%nodes)
		if _, err := c.client.CoreV1().Pods(p.Namespace).Create(ctx, p.DeepCopy(), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i, p := range b.world.Pods {
		running := waitRunning(t, c, p.Namespace, p.Name)
		b.world.Pods[i] = running
		b.targets[p.Namespace+"/"+p.Name] = nt.Target{
			NSPath: c.podNS(t, running),
			IP:     running.Status.PodIP,
		}
	}
	return b
}

// reconcile makes the cluster's labels and policies those of w and pols.
func (b *netpolBed) reconcile(t *testing.T, w *nt.World, pols []*networkingv1.NetworkPolicy) {
	t.Helper()
	ctx := context.Background()
	cs := b.c.client
	for _, want := range w.Namespaces {
		cur, err := cs.CoreV1().Namespaces().Get(ctx, want.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(cur.Labels, want.Labels) {
			cur.Labels = want.Labels
			if _, err := cs.CoreV1().Namespaces().Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, want := range w.Pods {
		cur, err := cs.CoreV1().Pods(want.Namespace).Get(ctx, want.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(cur.Labels, want.Labels) {
			cur.Labels = want.Labels
			if _, err := cs.CoreV1().Pods(want.Namespace).Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	wanted := map[string]*networkingv1.NetworkPolicy{}
	for _, p := range pols {
		wanted[p.Namespace+"/"+p.Name] = p
	}
	for _, ns := range nt.NamespaceNames {
		list, err := cs.NetworkingV1().NetworkPolicies(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, cur := range list.Items {
			if _, ok := wanted[ns+"/"+cur.Name]; !ok {
				if err := cs.NetworkingV1().NetworkPolicies(ns).Delete(ctx, cur.Name, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	for _, p := range pols {
		api := cs.NetworkingV1().NetworkPolicies(p.Namespace)
		cur, err := api.Get(ctx, p.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = api.Create(ctx, p.DeepCopy(), metav1.CreateOptions{})
		case err == nil:
			cur.Spec = *p.Spec.DeepCopy()
			_, err = api.Update(ctx, cur, metav1.UpdateOptions{})
		}
		if err != nil {
			t.Fatalf("policy %s/%s: %v", p.Namespace, p.Name, err)
		}
	}
}

// clusterClient is a ClusterNetworkPolicy client of the lab's admin.
func (b *netpolBed) clusterClient(t *testing.T) cnpclient.Interface {
	t.Helper()
	cc, err := kube.NewClusterPolicyClient(lab.AdminKubeconfig(b.c.state.Dir), "weft-e2e")
	if err != nil {
		t.Fatal(err)
	}
	return cc
}

// reconcileCluster makes the cluster's ClusterNetworkPolicies those of
// pols.
func (b *netpolBed) reconcileCluster(t *testing.T, pols []*cnpv1beta1.ClusterNetworkPolicy) {
	t.Helper()
	ctx := context.Background()
	cc := b.clusterClient(t)
	api := cc.PolicyV1beta1().ClusterNetworkPolicies()
	wanted := map[string]bool{}
	for _, p := range pols {
		wanted[p.Name] = true
		cur, err := api.Get(ctx, p.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = api.Create(ctx, p.DeepCopy(), metav1.CreateOptions{})
		case err == nil:
			cur.Spec = *p.Spec.DeepCopy()
			_, err = api.Update(ctx, cur, metav1.UpdateOptions{})
		}
		if err != nil {
			t.Fatalf("clusternetworkpolicy %s: %v", p.Name, err)
		}
	}
	list, err := api.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cur := range list.Items {
		if !wanted[cur.Name] {
			if err := api.Delete(ctx, cur.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// expect waits until the measured grid equals the oracle's for w, pols
// and the ClusterNetworkPolicies cluster.
func (b *netpolBed) expect(t *testing.T, w *nt.World, pols []*networkingv1.NetworkPolicy, what string, cluster ...*cnpv1beta1.ClusterNetworkPolicy) bool {
	t.Helper()
	want := oracle.Expect(oracle.World{Namespaces: w.Namespaces, Policies: pols, ClusterPolicies: cluster}, w.Pods, nt.Ports, nt.Protocols)
	got, err := nt.WaitMatch(time.Now().Add(20*time.Second), b.targets, want)
	if err != nil {
		t.Errorf("%s: %v\n%s", what, err, oracle.SideBySide(want, got))
		return false
	}
	return true
}

// conditionSays waits until ClusterNetworkPolicy name's weft condition
// has status and a message holding msg.
func (b *netpolBed) conditionSays(t *testing.T, name string, status metav1.ConditionStatus, msg string) {
	t.Helper()
	cc := b.clusterClient(t)
	var cond *metav1.Condition
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		p, err := cc.PolicyV1beta1().ClusterNetworkPolicies().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if cond = meta.FindStatusCondition(p.Status.Conditions, kube.ClusterPolicyCondition); cond != nil && cond.Status == status && strings.Contains(cond.Message, msg) {
			return
		}
	}
	t.Errorf("clusternetworkpolicy %s: condition %s is %+v, want %s saying %q", name, kube.ClusterPolicyCondition, cond, status, msg)
}

// whyAgrees holds weftctl why's answers (internal/why, reading the live
// cluster) against the oracle's grid for w, pols and cluster, which the
// probes have just matched: every cell, the same verdict.
func (b *netpolBed) whyAgrees(t *testing.T, w *nt.World, pols []*networkingv1.NetworkPolicy, what string, cluster ...*cnpv1beta1.ClusterNetworkPolicy) {
	t.Helper()
	cc := b.clusterClient(t)
	in, err := why.State(context.Background(), b.c.client, cc)
	if err != nil {
		t.Fatal(err)
	}
	e := why.NewExplainer(in)
	want := oracle.Expect(oracle.World{Namespaces: w.Namespaces, Policies: pols, ClusterPolicies: cluster}, w.Pods, nt.Ports, nt.Protocols)
	wrong := 0
	for _, c := range want.Cases() {
		a, err := e.Explain(why.Query{From: c.From, To: c.To, Port: uint16(c.Port), Protocol: policy.Protocol(c.Proto)})
		if err != nil {
			t.Fatalf("%s: why %s -> %s: %v", what, c.From, c.To, err)
		}
		if a.Allowed != want.Cells[c] {
			if wrong++; wrong <= 5 {
				var out strings.Builder
				a.Print(&out)
				t.Errorf("%s: weftctl why says allowed=%v, the probes %v:\n%s", what, a.Allowed, want.Cells[c], out.String())
			}
		}
	}
	if wrong > 0 {
		t.Errorf("%s: weftctl why disagrees with the probes on %d of %d cells", what, wrong, len(want.Cells))
	}
}

// droppedPackets sums weft_policy_dropped_packets_total over the nodes'
// agents, per direction.
func (c *cluster) droppedPackets(t *testing.T) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, n := range lab.NodeMembers(c.state.Members) {
		m, err := agentMetrics(n)
		if err != nil {
			t.Fatal(err)
		}
		for _, dir := range []string{"ingress", "egress"} {
			out[dir] += m[`weft_policy_dropped_packets_total{direction="`+dir+`"}`]
		}
	}
	return out
}

// agentMetrics reads a node's agent's /metrics: each sample's series (name
// and labels, as printed) to its value.
func agentMetrics(n lab.Member) (map[string]float64, error) {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: netnsutil.Dialer(n.NSPath(), nil)}}
	resp, err := client.Get(fmt.Sprintf("http://%s/metrics", net.JoinHostPort(n.IP.String(), strconv.Itoa(lab.AgentPort))))
	if err != nil {
		return nil, fmt.Errorf("metrics of %s: %w", n.Name, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	out := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		series, v, ok := strings.Cut(line, " ")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return nil, fmt.Errorf("metrics of %s: %q: %w", n.Name, line, err)
		}
		out[series] = f
	}
	return out, nil
}
