package agent

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weftnet/weft/cni"
)

func TestRenderConflistParsesAsPluginConfig(t *testing.T) {
	raw, err := RenderConflist(CNIConfig{Bridge: "weft0", MTU: 1450, DataDir: "/var/lib/weft/ipam",
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")}})
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		CNIVersion string            `json:"cniVersion"`
		Name       string            `json:"name"`
		Plugins    []json.RawMessage `json:"plugins"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		t.Fatal(err)
	}
	if list.CNIVersion != "1.1.0" || list.Name != "weft" || len(list.Plugins) != 2 {
		t.Fatalf("conflist header: %s", raw)
	}
	// The plugin's own parser accepts what the agent writes.
	var first map[string]any
	if err := json.Unmarshal(list.Plugins[0], &first); err != nil {
		t.Fatal(err)
	}
	first["cniVersion"], first["name"] = list.CNIVersion, list.Name
	stdin, _ := json.Marshal(first)
	cfg, err := cni.ParseConfig(stdin)
	if err != nil {
		t.Fatalf("weft rejects the agent's config: %v\n%s", err, stdin)
	}
	sets := cfg.Pool.Sets()
	if cfg.MTU != 1450 || cfg.Bridge != "weft0" || len(sets) != 2 || sets[1][0].Gateway.String() != "fd00:10:244:1::1" {
		t.Fatalf("parsed config: %+v sets %+v", cfg.NetConf, sets)
	}
}

func TestGateways(t *testing.T) {
	got := Gateways([]netip.Prefix{netip.MustParsePrefix("10.244.3.0/24"), netip.MustParsePrefix("fd00::/64")})
	if got[0].String() != "10.244.3.1/24" || got[1].String() != "fd00::1/64" {
		t.Fatalf("gateways %v", got)
	}
}

func TestRoutingNode(t *testing.T) {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{VTEPMACAnnotation: "02:00:00:00:00:01"}},
		Spec:       corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24", "fd00:10:244:1::/64"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeHostName, Address: "n1"},
			{Type: corev1.NodeInternalIP, Address: "172.18.0.11"},
			{Type: corev1.NodeExternalIP, Address: "198.51.100.1"},
		}},
	}
	rn, errs := RoutingNode(n)
	if len(errs) != 0 || len(rn.InternalIPs) != 1 || rn.InternalIPs[0].String() != "172.18.0.11" || len(rn.PodCIDRs) != 2 || rn.VTEPMAC.String() != "02:00:00:00:00:01" {
		t.Fatalf("got %+v %v", rn, errs)
	}

	bad := n.DeepCopy()
	bad.Status.Addresses[1].Address = "not-an-ip"
	bad.Spec.PodCIDRs = []string{"10.244.1.0/33"}
	bad.Annotations[VTEPMACAnnotation] = "zz"
	rn, errs = RoutingNode(bad)
	if len(errs) != 3 || len(rn.InternalIPs) != 0 || len(rn.PodCIDRs) != 0 || rn.VTEPMAC != nil {
		t.Fatalf("bad node: %+v %v", rn, errs)
	}
	for i, field := range []string{"status.addresses", "spec.podCIDRs", "annotations"} {
		if errs[i].Node != "n1" || !strings.Contains(errs[i].Error(), field) {
			t.Errorf("error %d = %v, want node n1 and field %s", i, errs[i], field)
		}
	}

	legacy := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "old"}, Spec: corev1.NodeSpec{PodCIDR: "10.244.9.0/24"}}
	if rn, _ := RoutingNode(legacy); len(rn.PodCIDRs) != 1 {
		t.Fatalf("spec.podCIDR alone not used: %+v", rn)
	}
}

func TestMasqueradeRules(t *testing.T) {
	got := MasqueradeRules([]netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")})
	want := []string{
		"*nat", ":WEFT-POSTROUTING - [0:0]",
		`-A WEFT-POSTROUTING -s 10.244.0.0/16 -d 10.244.0.0/16 -m comment --comment "pod to pod" -j RETURN`,
		"-A WEFT-POSTROUTING -s 10.244.0.0/16 -d 224.0.0.0/4 -j RETURN",
		`-A WEFT-POSTROUTING -s 10.244.0.0/16 -m comment --comment "pod leaving the cluster" -j MASQUERADE --random-fully`,
		"COMMIT", "*filter", ":WEFT-FORWARD - [0:0]",
		"-A WEFT-FORWARD -s 10.244.0.0/16 -j ACCEPT", "-A WEFT-FORWARD -d 10.244.0.0/16 -j ACCEPT", "COMMIT",
	}
	if got != strings.Join(want, "\n")+"\n" {
		t.Fatalf("got:\n%s", got)
	}
	for _, line := range strings.Split(got, "\n") {
		if strings.HasPrefix(line, "-A ") && !strings.HasPrefix(line, "-A WEFT-") {
			t.Fatalf("rule outside weft's chains: %s", line)
		}
	}
}
