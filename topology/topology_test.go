package topology

import (
	"encoding/json"
	"math"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/weftnet/weft/cni"
	"github.com/weftnet/weft/ipam"
)

// The address plan: pods 10.244.0.0/16, a node's podCIDR a /24 of it.
var (
	podCIDR   = netip.MustParsePrefix("10.244.1.0/24")
	podCIDRv6 = netip.MustParsePrefix("fd00:10:244:1::/64")
	tinyCIDR  = netip.MustParsePrefix("10.244.1.0/29") // network, gateway, broadcast and 5 pods
)

func TestUsablePodIPs(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cidrs []netip.Prefix
		want  int64
	}{
		{"a /24 less network, gateway, broadcast", []netip.Prefix{podCIDR}, 253},
		{"a /29", []netip.Prefix{tinyCIDR}, 5},
		{"a /30 holds one pod", []netip.Prefix{netip.MustParsePrefix("10.244.1.0/30")}, 1},
		{"dual-stack: the smaller family decides", []netip.Prefix{tinyCIDR, podCIDRv6}, 5},
		{"IPv6 /64 is clamped", []netip.Prefix{podCIDRv6}, math.MaxInt64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := UsablePodIPs(tc.cidrs)
			if err != nil || got != tc.want {
				t.Fatalf("UsablePodIPs(%v) = %d, %v; want %d", tc.cidrs, got, err, tc.want)
			}
		})
	}
	if _, err := UsablePodIPs([]netip.Prefix{netip.MustParsePrefix("10.244.1.0/31")}); err == nil || !strings.Contains(err.Error(), "10.244.1.0/31") {
		t.Fatalf("a /31 podCIDR: got %v, want an error naming it", err)
	}
}

func pod(ns, name, uid string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + uidOr(uid, name))},
		Spec: corev1.PodSpec{NodeName: "node1"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
}

func uidOr(uid, name string) string {
	if uid != "" {
		return uid
	}
	return name
}

func alloc(id string, ref *ipam.PodRef) ipam.Allocation {
	return ipam.Allocation{Key: ipam.Key{ContainerID: id, IfName: "eth0"}, Addresses: []netip.Addr{netip.MustParseAddr("10.244.1.9")}, Pod: ref}
}

func TestPodIPsInUse(t *testing.T) {
	a, b, c := pod("x", "a", ""), pod("x", "b", ""), pod("x", "c", "")
	host := pod("x", "host", "")
	host.Spec.HostNetwork = true
	done := pod("x", "done", "")
	done.Status.Phase = corev1.PodSucceeded
	failed := pod("x", "failed", "")
	failed.Status.Phase = corev1.PodFailed
	deleting := pod("x", "deleting", "")
	deleting.DeletionTimestamp = &metav1.Time{}
	allocs := []ipam.Allocation{
		alloc("1", &ipam.PodRef{Namespace: "x", Name: "a", UID: "uid-a"}), // a's
		alloc("2", &ipam.PodRef{Namespace: "x", Name: "b"}),               // b's (runtime gave no UID)
		alloc("3", &ipam.PodRef{Namespace: "x", Name: "c", UID: "old"}),   // an earlier c's, not this c's
		alloc("4", nil), // unnamed
	}
	// 4 allocations, plus c waiting for its address; the host-network,
	// finished and deleting pods need none.
	if got := PodIPsInUse(allocs, []*corev1.Pod{a, b, c, host, done, failed, deleting}); got != 5 {
		t.Fatalf("in use = %d, want 5", got)
	}
	if got := PodIPsInUse(nil, []*corev1.Pod{a, b}); got != 2 {
		t.Fatalf("bound pods without allocations: in use = %d, want 2", got)
	}
}

func node() *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node1", ResourceVersion: "42",
			Labels: map[string]string{"kubernetes.io/hostname": "node1"}, Annotations: map[string]string{"weft.dev/vtep-mac": "aa"}},
		Spec: corev1.NodeSpec{PodCIDR: tinyCIDR.String(), Taints: []corev1.Taint{{Key: "dedicated", Value: "db", Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{
			Capacity:    corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110"), "example.com/widget": resource.MustParse("1")},
			Allocatable: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110")},
		},
	}
}

func decode(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestComputeAndPatches(t *testing.T) {
	in := Input{PodCIDRs: []netip.Prefix{tinyCIDR}, PodIPsInUse: 4, BandwidthMbit: 10000,
		Facts: Facts{Routing: "vxlan", MTU: 1450, VTEP: netip.MustParseAddr("172.18.0.11"), Rack: "r1"}}
	d, err := Compute(in)
	if err != nil {
		t.Fatal(err)
	}
	if d.Exhausted || d.UsablePodIPs != 5 {
		t.Fatalf("4 of 5 in use: exhausted %v, usable %d", d.Exhausted, d.UsablePodIPs)
	}
	n := node()
	status := decode(t, StatusPatch(n, d))
	want := map[string]any{"status": map[string]any{
		"capacity":    map[string]any{"weft.dev/pod-ips": "5", "weft.dev/bandwidth": "10k"},
		"allocatable": map[string]any{"weft.dev/pod-ips": "5", "weft.dev/bandwidth": "10k"},
	}}
	if !reflect.DeepEqual(status, want) {
		t.Fatalf("status patch %v, want %v (only weft's keys)", status, want)
	}
	meta := decode(t, MetadataPatch(n, d))
	wantMeta := map[string]any{"metadata": map[string]any{
		"labels":      map[string]any{"weft.dev/routing": "vxlan", "weft.dev/rack": "r1"},
		"annotations": map[string]any{"weft.dev/mtu": "1450", "weft.dev/vtep-address": "172.18.0.11"},
	}}
	if !reflect.DeepEqual(meta, wantMeta) {
		t.Fatalf("metadata patch %v, want %v", meta, wantMeta)
	}
	if p := TaintPatch(n, d.Exhausted); p != nil {
		t.Fatalf("not exhausted and not tainted: patch %s, want none", p)
	}

	// Applied: nothing more to write.
	for _, l := range []corev1.ResourceList{n.Status.Capacity, n.Status.Allocatable} {
		for k, v := range d.Resources {
			l[k] = v
		}
	}
	for k, v := range d.Labels {
		n.Labels[k] = v
	}
	for k, v := range d.Annotations {
		n.Annotations[k] = v
	}
	if p := StatusPatch(n, d); p != nil {
		t.Fatalf("status patch %s for a node that matches", p)
	}
	if p := MetadataPatch(n, d); p != nil {
		t.Fatalf("metadata patch %s for a node that matches", p)
	}

	// The fifth address taken: tainted, the other taint kept, guarded by
	// the resourceVersion.
	in.PodIPsInUse = 5
	d, _ = Compute(in)
	if !d.Exhausted {
		t.Fatal("5 of 5 in use: not exhausted")
	}
	taint := decode(t, TaintPatch(n, true))
	wantTaint := map[string]any{"metadata": map[string]any{"resourceVersion": "42"}, "spec": map[string]any{"taints": []any{
		map[string]any{"key": "dedicated", "value": "db", "effect": "NoSchedule"},
		map[string]any{"key": "weft.dev/pod-ips-exhausted", "effect": "NoSchedule"},
	}}}
	if !reflect.DeepEqual(taint, wantTaint) {
		t.Fatalf("taint patch %v, want %v", taint, wantTaint)
	}
	n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: ExhaustedTaint, Effect: corev1.TaintEffectNoSchedule})
	if !Tainted(n) || TaintPatch(n, true) != nil {
		t.Fatal("a tainted node still gets a taint patch")
	}
	lift := decode(t, TaintPatch(n, false))
	if got := lift["spec"].(map[string]any)["taints"]; !reflect.DeepEqual(got, []any{map[string]any{"key": "dedicated", "value": "db", "effect": "NoSchedule"}}) {
		t.Fatalf("lifting keeps %v, want only the other taint", got)
	}
	n.Spec.Taints = n.Spec.Taints[1:]
	if got := decode(t, TaintPatch(n, false))["spec"].(map[string]any)["taints"]; !reflect.DeepEqual(got, []any{}) {
		t.Fatalf("lifting the only taint: %v, want an empty list", got)
	}

	// Bandwidth and rack no longer known: removed, and only they.
	in.BandwidthMbit, in.Facts.Rack = 0, ""
	d, _ = Compute(in)
	status = decode(t, StatusPatch(n, d))
	want = map[string]any{"status": map[string]any{
		"capacity": map[string]any{"weft.dev/bandwidth": nil}, "allocatable": map[string]any{"weft.dev/bandwidth": nil},
	}}
	if !reflect.DeepEqual(status, want) {
		t.Fatalf("status patch %v, want %v", status, want)
	}
	if meta := decode(t, MetadataPatch(n, d)); !reflect.DeepEqual(meta, map[string]any{"metadata": map[string]any{"labels": map[string]any{"weft.dev/rack": nil}}}) {
		t.Fatalf("metadata patch %v, want the rack label removed", meta)
	}
}

func TestNoPodCIDRNoPodIPs(t *testing.T) {
	d, err := Compute(Input{PodIPsInUse: 3, Facts: Facts{Routing: "hostgw"}})
	if err != nil || d.Exhausted || len(d.Resources) != 0 {
		t.Fatalf("no podCIDR: %+v, %v; want nothing published, no taint", d, err)
	}
}

func TestMaxPodsWarning(t *testing.T) {
	n := node()
	if w := MaxPodsWarning(n, 5); !strings.Contains(w, "110") || !strings.Contains(w, "hold 5") || !strings.Contains(w, tinyCIDR.String()) {
		t.Fatalf("warning %q: want maxPods, the podCIDR and its capacity", w)
	}
	if w := MaxPodsWarning(n, 253); w != "" {
		t.Fatalf("maxPods 110 within 253 addresses: warning %q", w)
	}
	delete(n.Status.Capacity, corev1.ResourcePods)
	if w := MaxPodsWarning(n, 5); w != "" {
		t.Fatalf("no maxPods reported: warning %q", w)
	}
}

func requesting(name string, reqs ...string) *corev1.Pod {
	p := pod("x", name, "")
	for i, r := range reqs {
		c := corev1.Container{Name: "c" + string(rune('0'+i))}
		if r != "" {
			c.Resources.Limits = corev1.ResourceList{BandwidthResource: resource.MustParse(r)}
		}
		p.Spec.Containers = append(p.Spec.Containers, c)
	}
	return p
}

func TestPodBandwidth(t *testing.T) {
	for _, tc := range []struct {
		pod  *corev1.Pod
		want int64
		err  string
	}{
		{requesting("none", ""), 0, ""},
		{requesting("one", "40"), 40, ""},
		{requesting("sum", "40", "", "60"), 100, ""},
		{requesting("fraction", "1500m"), 0, `container "c0": resources weft.dev/bandwidth: 1500m is not a positive whole number`},
		{requesting("negative", "40", "-5"), 0, `container "c1"`},
		{requesting("zero", "0"), 0, `container "c0"`},
	} {
		got, err := PodBandwidth(tc.pod)
		if got != tc.want || (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s: %d, %v; want %d, %q", tc.pod.Name, got, err, tc.want, tc.err)
		}
	}
	init := requesting("init", "40")
	init.Spec.InitContainers = []corev1.Container{{Name: "i", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{BandwidthResource: resource.MustParse("100")}}}}
	if got, err := PodBandwidth(init); got != 100 || err != nil {
		t.Errorf("an init container asking more: %d, %v; want 100", got, err)
	}
}

func TestShapes(t *testing.T) {
	limited, free, bad := requesting("limited", "40"), requesting("free", ""), requesting("bad", "-1")
	stale := requesting("stale", "80")
	allocs := []ipam.Allocation{
		alloc("c-limited", &ipam.PodRef{Namespace: "x", Name: "limited", UID: "uid-limited"}),
		alloc("c-free", &ipam.PodRef{Namespace: "x", Name: "free"}),
		alloc("c-bad", &ipam.PodRef{Namespace: "x", Name: "bad"}),
		alloc("c-stale", &ipam.PodRef{Namespace: "x", Name: "stale", UID: "an-earlier-pod"}),
		alloc("c-unnamed", nil),
	}
	shapes, errs := Shapes([]*corev1.Pod{limited, free, bad, stale}, allocs)
	veth := cni.HostVethName("c-limited", "eth0")
	want := []Shape{{Pod: "x/limited", HostVeth: veth, IFB: "wftb" + veth[4:], RateBytes: 5_000_000, Burst: 50_000, Limit: 300_000}}
	if !reflect.DeepEqual(shapes, want) {
		t.Fatalf("shapes %+v, want %+v", shapes, want)
	}
	if len(errs) != 1 || errs[0].Pod != "x/bad" || !strings.Contains(errs[0].Error(), "pod x/bad: container") {
		t.Fatalf("errors %v, want x/bad's", errs)
	}
	if len(veth) != 15 || len(shapes[0].IFB) != 15 {
		t.Fatalf("interface names %q, %q: want 15 characters", veth, shapes[0].IFB)
	}
}

func TestNewShapeSmallAndLargeRates(t *testing.T) {
	if s := NewShape("x/p", "weft0123456789a", 1); s.RateBytes != 125_000 || s.Burst != minBurst || s.Limit != minBurst+6_250 {
		t.Fatalf("1 Mbit/s: %+v (the bucket must hold full-size packets)", s)
	}
	if s := NewShape("x/p", "weft0123456789a", 100_000); s.RateBytes != 12_500_000_000 || s.Burst != 125_000_000 || s.Limit != 125_000_000+625_000_000 {
		t.Fatalf("100 Gbit/s: %+v", s)
	}
}
