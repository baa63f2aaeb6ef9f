package agent

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/weftnet/weft/routing/bgp"
)

func TestBGPServices(t *testing.T) {
	node, other := "node-1", "node-2"
	yes, no := true, false
	svc := func(name string, local bool, ext []string, lb ...string) *corev1.Service {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ExternalIPs: ext}}
		if local {
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		}
		for _, ip := range lb {
			s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
		}
		return s
	}
	slice := func(svcName, onNode string, ready *bool) *discovery.EndpointSlice {
		return &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: svcName + "-x", Labels: map[string]string{discovery.LabelServiceName: svcName}},
			Endpoints: []discovery.Endpoint{{NodeName: &onNode, Conditions: discovery.EndpointConditions{Ready: ready}}}}
	}
	clusterIP := svc("plain", false, nil)
	clusterIP.Spec.Type = corev1.ServiceTypeClusterIP
	got := BGPServices([]*corev1.Service{
		svc("cluster", false, []string{"172.20.0.1", "bogus"}, "172.20.0.2"),
		svc("local-here", true, nil, "172.20.0.3"),
		svc("local-elsewhere", true, nil, "172.20.0.4"),
		svc("local-notready", true, nil, "fd00:20::5"),
		clusterIP,
	}, []*discovery.EndpointSlice{slice("local-here", node, nil), slice("local-elsewhere", other, &yes), slice("local-notready", node, &no)}, node)
	want := "[{ns/cluster [172.20.0.1] [172.20.0.2] false false} {ns/local-elsewhere [] [172.20.0.4] true false} {ns/local-here [] [172.20.0.3] true true} {ns/local-notready [] [fd00:20::5] true false}]"
	if s := fmt.Sprint(got); s != want {
		t.Errorf("BGPServices\n got %s\nwant %s", s, want)
	}
}

// TestBGPConfigKeepsLastGood: a ConfigMap that fails validation is logged
// naming the key and field, and the previous configuration stays.
func TestBGPConfigKeepsLastGood(t *testing.T) {
	var logs bytes.Buffer
	b, err := NewBGP(nil, BGPOptions{NodeName: "node-1", ConfigNamespace: "kube-system", ConfigName: "weft-bgp", Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	cm := func(rv, yaml string) func() (*corev1.ConfigMap, error) {
		return func() (*corev1.ConfigMap, error) {
			return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{ResourceVersion: rv}, Data: map[string]string{bgp.ConfigKey: yaml}}, nil
		}
	}
	if s := b.config(func() (*corev1.ConfigMap, error) { return nil, errors.New("not found") }); s.ASN != bgp.DefaultASN {
		t.Errorf("no ConfigMap: asn %d, want the default", s.ASN)
	}
	if s := b.config(cm("1", "asn: 65100\n")); s.ASN != 65100 {
		t.Fatalf("good ConfigMap: asn %d", s.ASN)
	}
	s := b.config(cm("2", "asn: 65200\nimport: {prefixes: [10.0.0.1/8]}\n"))
	if s.ASN != 65100 {
		t.Errorf("bad ConfigMap: asn %d, want the previous 65100 kept", s.ASN)
	}
	if !strings.Contains(logs.String(), "import.prefixes[0]") || !strings.Contains(logs.String(), "kube-system/weft-bgp") {
		t.Errorf("the refusal does not name the ConfigMap and the field: %s", logs.String())
	}
	// A bad peer drops only that peer; a missing Secret too.
	in, err := b.input(
		func(labels.Selector) ([]*corev1.Node, error) {
			return []*corev1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "172.18.0.11"}}}}}, nil
		},
		nil, nil,
		cm("3", "peers:\n- {name: a, address: 172.18.0.1, asn: 65000, passwordSecret: {name: missing, key: k}}\n- {name: b, address: 172.18.0.2, asn: 65000}\n- {name: c, address: x, asn: 65000}\n"),
		func(name string) (*corev1.Secret, error) { return nil, fmt.Errorf("secret %q not found", name) })
	if err != nil {
		t.Fatal(err)
	}
	plan, errs := bgp.Compute(in)
	if len(plan.Neighbors) != 1 || plan.Neighbors[0].Address != netip.MustParseAddr("172.18.0.2") || len(errs) != 1 {
		t.Errorf("neighbours %+v, errors %v: want only peer b", plan.Neighbors, errs)
	}
	for _, field := range []string{"peers[0].passwordSecret", "peers[2].address"} {
		if !strings.Contains(logs.String(), field) {
			t.Errorf("log does not name %s: %s", field, logs.String())
		}
	}
}
