package check

import (
	"context"
	"fmt"
	"net"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/weftnet/weft/lab"
	"github.com/weftnet/weft/lab/workload"
)

// nameLabel carries each probe pod's name, for policy selectors.
const nameLabel = "weft-check/name"

// policyWait bounds how long the agents may take to program a policy change.
const policyWait = 15 * time.Second

// policies adds the NetworkPolicy rows: the first probe pod is isolated for
// ingress, allowing only the probe pod on the second node (when there is
// one). The second probe pod on the first node (same node) and the one on
// the third node (other node) must be refused, the first node must still
// reach its pod, and deleting the policy must lift the isolation.
func policies(ctx context.Context, st *lab.State, c kubernetes.Interface, pods []endpoint) []Result {
	target := pods[0]
	sameNode := pods[len(pods)-1] // probe-<node1>-b
	var allowed, otherNode *endpoint
	if len(pods) > 2 {
		allowed = &pods[1]
	}
	if len(pods) > 3 {
		otherNode = &pods[2]
	}
	pol := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "isolate-" + target.name},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{nameLabel: target.name}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{},
		}}
	if allowed != nil {
		pol.Spec.Ingress = append(pol.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{
			{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{nameLabel: allowed.name}}}}})
	}
	api := c.NetworkingV1().NetworkPolicies(Namespace)
	if _, err := api.Create(ctx, pol, metav1.CreateOptions{}); err != nil {
		return []Result{{Kind: "policy", From: "-", To: pol.Name, Detail: err.Error()}}
	}
	url := "http://" + net.JoinHostPort(target.ip.String(), "80") + "/"
	var out []Result
	denied := func(kind string, from endpoint) {
		out = append(out, probeRefused(ctx, kind, from, target.name, url))
	}
	reached := func(kind string, from endpoint) {
		out = append(out, probeHTTP(ctx, kind, from.name, from.dial, target.name, url, func(r workload.Reply) error {
			if r.Pod != target.name {
				return fmt.Errorf("answered by %q, want %q", r.Pod, target.name)
			}
			return nil
		}, policyWait))
	}
	denied("policy: denied pod, same node", sameNode)
	if otherNode != nil {
		denied("policy: denied pod, other node", *otherNode)
	}
	if allowed != nil {
		reached("policy: allowed pod, other node", *allowed)
	}
	reached("policy: node to its isolated pod", endpoint{name: target.node.Name, nsPath: target.node.NSPath(), dial: st.Dialer(target.node.NSPath())})
	if err := api.Delete(ctx, pol.Name, metav1.DeleteOptions{}); err != nil {
		return append(out, Result{Kind: "policy", From: "-", To: pol.Name, Detail: err.Error()})
	}
	reached("policy: deleted policy lifts isolation", sameNode)
	return out
}

// probeRefused passes once a probe from `from` gets no answer: the policy
// may take a moment to be programmed, so it retries until policyWait.
func probeRefused(ctx context.Context, kind string, from endpoint, to, url string) Result {
	r := Result{Kind: kind, From: from.name, To: to}
	deadline := time.Now().Add(policyWait)
	for {
		reply, err := httpGet(ctx, from.dial, url)
		if err != nil {
			r.OK, r.Detail = true, "no answer: "+err.Error()
			return r
		}
		if !time.Now().Before(deadline) {
			r.Detail = fmt.Sprintf("%s still answered (saw %s)", reply.Pod, reply.Client)
			return r
		}
		time.Sleep(100 * time.Millisecond)
	}
}
