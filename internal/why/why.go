// Package why answers "why is this connection allowed or dropped?" for a
// live cluster: it reads the objects weft-agent enforces (Pods,
// Namespaces, NetworkPolicies, ClusterNetworkPolicies, Nodes), compiles
// them with the agent's compiler (policy.Compile) and evaluates one
// connection with policy.Desired.Explain, so its answer is the rules'
// verdict, with what decided it in each direction. weftctl why prints it.
package why

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	cnpclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"

	"github.com/weftnet/weft/kube"
	"github.com/weftnet/weft/policy"
)

// Query is one connection: each end a pod (NAMESPACE/NAME) or an
// address, and the destination port and protocol.
type Query struct {
	From, To string
	Port     uint16
	Protocol policy.Protocol
}

// ParsePort reads PORT or PORT/PROTO (TCP when no protocol is given).
func ParsePort(s string) (uint16, policy.Protocol, error) {
	num, proto, _ := strings.Cut(s, "/")
	n, err := strconv.ParseUint(num, 10, 16)
	if err != nil || n == 0 {
		return 0, "", fmt.Errorf("port %q: want a port number from 1 to 65535, and /TCP, /UDP or /SCTP", s)
	}
	p := policy.TCP
	if proto != "" {
		p = policy.Protocol(strings.ToUpper(proto))
		if p != policy.TCP && p != policy.UDP && p != policy.SCTP {
			return 0, "", fmt.Errorf("port %q: unknown protocol %q (want TCP, UDP or SCTP)", s, proto)
		}
	}
	return uint16(n), p, nil
}

// Answer is the verdict on a query and its reasons.
type Answer struct {
	Query
	FromAddr, ToAddr netip.Addr
	policy.Explanation
	// Errors are the problems of the policies that decide for either end.
	Errors []*policy.FieldError
}

// State reads the cluster's policy inputs. cc may be nil (no
// ClusterNetworkPolicy client); ClusterNetworkPolicies are read when
// their CRD is served.
func State(ctx context.Context, c kubernetes.Interface, cc cnpclient.Interface) (policy.Input, error) {
	var in policy.Input
	pods, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return in, fmt.Errorf("listing pods: %w", err)
	}
	for i := range pods.Items {
		in.Pods = append(in.Pods, &pods.Items[i])
	}
	nss, err := c.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return in, fmt.Errorf("listing namespaces: %w", err)
	}
	for i := range nss.Items {
		in.Namespaces = append(in.Namespaces, &nss.Items[i])
	}
	pols, err := c.NetworkingV1().NetworkPolicies("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return in, fmt.Errorf("listing networkpolicies: %w", err)
	}
	for i := range pols.Items {
		in.Policies = append(in.Policies, &pols.Items[i])
	}
	if cc == nil {
		return in, nil
	}
	served, err := kube.ClusterPoliciesServed(c)
	if err != nil || !served {
		return in, err
	}
	cnps, err := cc.PolicyV1beta1().ClusterNetworkPolicies().List(ctx, metav1.ListOptions{})
	if err != nil {
		return in, fmt.Errorf("listing clusternetworkpolicies: %w", err)
	}
	for i := range cnps.Items {
		in.ClusterPolicies = append(in.ClusterPolicies, &cnps.Items[i])
	}
	nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return in, fmt.Errorf("listing nodes: %w", err)
	}
	for i := range nodes.Items {
		in.Nodes = append(in.Nodes, &nodes.Items[i])
	}
	return in, nil
}

// Explainer answers queries over one cluster state, compiled once.
type Explainer struct {
	in policy.Input
	d  policy.Desired
}

// NewExplainer compiles in.
func NewExplainer(in policy.Input) *Explainer { return &Explainer{in: in, d: policy.Compile(in)} }

// Explain answers q.
func (e *Explainer) Explain(q Query) (Answer, error) {
	a := Answer{Query: q}
	from, err := resolve(e.in, q.From)
	if err != nil {
		return a, fmt.Errorf("from: %w", err)
	}
	to, err := resolve(e.in, q.To)
	if err != nil {
		return a, fmt.Errorf("to: %w", err)
	}
	a.FromAddr, a.ToAddr, err = pair(from, to)
	if err != nil {
		return a, err
	}
	a.Explanation = e.d.Explain(a.FromAddr, a.ToAddr, q.Protocol, q.Port)
	deciding := map[string]bool{}
	for _, x := range []*policy.Decision{a.Egress, a.Ingress} {
		if x == nil {
			continue
		}
		deciding[x.Policy] = true
		for _, p := range x.Policies {
			deciding[p] = true
		}
	}
	for _, fe := range e.d.Errors {
		if deciding[fe.Policy] {
			a.Errors = append(a.Errors, fe)
		}
	}
	return a, nil
}

// resolve is an end's addresses: a pod's (NAMESPACE/NAME), or an address.
func resolve(in policy.Input, end string) ([]netip.Addr, error) {
	if ip, err := netip.ParseAddr(end); err == nil {
		return []netip.Addr{ip.Unmap()}, nil
	}
	ns, name, ok := strings.Cut(end, "/")
	if !ok {
		return nil, fmt.Errorf("%q is neither NAMESPACE/NAME of a pod nor an address", end)
	}
	for _, p := range in.Pods {
		if p.Namespace == ns && p.Name == name {
			ips := policy.PodIPs(p)
			if len(ips) == 0 {
				return nil, fmt.Errorf("pod %s has no address policies apply to (host network, not running yet, or finished)", end)
			}
			return ips, nil
		}
	}
	return nil, fmt.Errorf("no pod %s", end)
}

// pair picks one address of each end of the same family, IPv4 first.
func pair(from, to []netip.Addr) (netip.Addr, netip.Addr, error) {
	for _, v6 := range []bool{false, true} {
		for _, f := range from {
			for _, t := range to {
				if f.Is6() == v6 && t.Is6() == v6 {
					return f, t, nil
				}
			}
		}
	}
	return netip.Addr{}, netip.Addr{}, errors.New("the two ends have no address family in common")
}

// Print writes the answer for people.
func (a Answer) Print(w io.Writer) {
	verdict := "DENIED"
	if a.Allowed {
		verdict = "ALLOWED"
	}
	fmt.Fprintf(w, "%s -> %s port %d/%s: %s\n", end(a.From, a.FromAddr), end(a.To, a.ToAddr), a.Port, a.Protocol, verdict)
	side := func(dir, end string, x *policy.Decision) {
		switch {
		case x == nil && a.podOf(end) == "":
			fmt.Fprintf(w, "  %s: %s is no pod: no policy applies\n", dir, end)
		case x == nil:
			fmt.Fprintf(w, "  %s of %s: no policy selects it: allowed\n", dir, end)
		default:
			fmt.Fprintf(w, "  %s of %s: %s\n", dir, x.Pod, x)
			for _, p := range x.Passed {
				fmt.Fprintf(w, "    passed on by Admin ClusterNetworkPolicy %s (priority %d) rule %s\n", p.Policy, p.Priority, p.Rule)
			}
			if len(x.Cluster) > 0 {
				fmt.Fprintf(w, "    ClusterNetworkPolicies with rules for this direction, in order: %s\n", strings.Join(x.Cluster, ", "))
			}
			if x.Tier != policy.TierNetworkPolicy && len(x.Policies) > 0 {
				fmt.Fprintf(w, "    NetworkPolicies selecting the pod: %s\n", strings.Join(x.Policies, ", "))
			}
		}
	}
	side("egress", a.From, a.Egress)
	if a.Egress == nil || a.Egress.Allowed {
		side("ingress", a.To, a.Ingress)
	}
	for _, e := range a.Errors {
		fmt.Fprintf(w, "  note: %v\n", e)
	}
}

// podOf is the pod an end names ("" for an address).
func (a Answer) podOf(end string) string {
	if _, err := netip.ParseAddr(end); err == nil {
		return ""
	}
	return end
}

func end(name string, addr netip.Addr) string {
	if name == addr.String() {
		return name
	}
	return name + " (" + addr.String() + ")"
}
