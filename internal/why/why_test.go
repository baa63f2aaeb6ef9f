package why

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	cnp "sigs.k8s.io/network-policy-api/apis/v1beta1"
	cnpfake "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned/fake"

	"github.com/weftnet/weft/policy"
	nt "github.com/weftnet/weft/policy/netpoltest"
)

// served makes the fake discovery list ClusterNetworkPolicies.
func served(c *fake.Clientset) {
	c.Resources = append(c.Resources, &metav1.APIResourceList{GroupVersion: "policy.networking.k8s.io/v1beta1",
		APIResources: []metav1.APIResource{{Name: "clusternetworkpolicies", Kind: "ClusterNetworkPolicy"}}})
}

// TestWhy reads a cluster through its API (fake clients), answers, and
// prints the policy, rule and tier that decided.
func TestWhy(t *testing.T) {
	w := nt.Addressed()
	var objs []runtime.Object
	for _, p := range w.Pods {
		objs = append(objs, p)
	}
	for _, n := range w.Namespaces {
		objs = append(objs, n)
	}
	objs = append(objs, nt.Policy("y", "only-x-c", nil, nt.Ingress(nt.From(nt.Peers(nt.NSPodPeer(nt.L(nt.NSLabel, "x"), nt.L(nt.PodLabel, "c")))))))
	c := fake.NewClientset(objs...)
	served(c)
	deny := nt.ClusterPolicy("no-z", cnp.AdminTier, 7, metav1.LabelSelector{}, func(s *cnp.ClusterNetworkPolicySpec) {
		s.Ingress = []cnp.ClusterNetworkPolicyIngressRule{{Name: "from-z", Action: cnp.ClusterNetworkPolicyRuleActionDeny,
			From: []cnp.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{MatchLabels: nt.L(nt.NSLabel, "z")}}}}}
	})
	cc := cnpfake.NewClientset(deny)
	in, err := State(context.Background(), c, cc)
	if err != nil {
		t.Fatal(err)
	}
	e := NewExplainer(in)
	for _, tc := range []struct {
		q       Query
		allowed bool
		says    []string
	}{
		{Query{"z/a", "x/b", 80, policy.TCP}, false, []string{"z/a (10.244.2.2) -> x/b (10.244.0.3) port 80/TCP: DENIED",
			"ingress of x/b: denied by Admin ClusterNetworkPolicy no-z (priority 7) rule from-z: Deny"}},
		{Query{"x/a", "y/a", 81, policy.UDP}, false, []string{"ingress of y/a: denied: isolated by NetworkPolicies [y/only-x-c], none allows",
			"ClusterNetworkPolicies with rules for this direction, in order: no-z"}},
		{Query{"x/c", "y/a", 81, policy.UDP}, true, []string{"ingress of y/a: allowed by NetworkPolicy y/only-x-c"}},
		{Query{"192.0.2.1", "x/a", 80, policy.TCP}, true, []string{"egress: 192.0.2.1 is no pod: no policy applies", "ingress of x/a: allowed: no policy decides"}},
	} {
		a, err := e.Explain(tc.q)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		a.Print(&out)
		if a.Allowed != tc.allowed {
			t.Errorf("%+v: allowed %v, want %v\n%s", tc.q, a.Allowed, tc.allowed, out.String())
		}
		for _, s := range tc.says {
			if !strings.Contains(out.String(), s) {
				t.Errorf("%+v: the answer does not say %q:\n%s", tc.q, s, out.String())
			}
		}
	}
	for _, bad := range []Query{{From: "x/nope", To: "x/a", Port: 80, Protocol: policy.TCP}, {From: "x", To: "x/a", Port: 80, Protocol: policy.TCP},
		{From: "x/a", To: "fd00::1", Port: 80, Protocol: policy.TCP}} {
		if _, err := e.Explain(bad); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}

func TestParsePort(t *testing.T) {
	for in, want := range map[string]string{"80": "80/TCP", "53/udp": "53/UDP", "9/SCTP": "9/SCTP", "0": "", "80/icmp": "", "x": "", "70000": ""} {
		n, p, err := ParsePort(in)
		got := ""
		if err == nil {
			got = strconv.Itoa(int(n)) + "/" + string(p)
		}
		if got != want {
			t.Errorf("ParsePort(%q) = %q (%v), want %q", in, got, err, want)
		}
	}
}
