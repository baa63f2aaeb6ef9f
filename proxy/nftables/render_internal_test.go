package nftables

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weftnet/weft/proxy/model"
)

func TestNextSize(t *testing.T) {
	for _, c := range []struct {
		cur  uint8
		n    int
		want uint8
	}{
		{0, 0, 0},
		{0, sizedFrom - 1, 0},    // small: a resizable hash
		{0, sizedFrom, minSized}, // 8192 + 2048 fit 2^14
		{0, 13107, minSized},     // 13107 + 3276 = 16383 fit 2^14
		{0, 13108, 15},           // 13108 + 3277 = 16385 do not
		{0, 2_000_000, 22},       // 2.5M fit 2^22
		{14, 16384, 14},          // full, but fits: kept
		{14, 16385, 15},          // past the limit: grown
		{15, 4096, 15},           // an eighth full: kept
		{15, 4095, 0},            // less: back to a resizable hash
		{22, 400_000, 19},        // shrunk to fit 500k
		{14, sizedFrom - 1, 14},  // under sizedFrom but not an eighth: kept
	} {
		if got := nextSize(c.cur, c.n); got != c.want {
			t.Errorf("nextSize(%d, %d) = %d, want %d", c.cur, c.n, got, c.want)
		}
	}
}

func TestAdoptSize(t *testing.T) {
	for _, c := range []struct {
		kernel, m string
		e         uint8
		ok        bool
	}{
		{"lb4-10-s22", "lb4-10", 22, true},
		{"lb-cluster6-3-s14", "lb-cluster6-3", 14, true},
		{"lb4-10", "", 0, false},
		{"lb4-10-s13", "", 0, false}, // below the smallest class
		{"lb4-10-s40", "", 0, false},
		{"lb4-10-sx", "", 0, false},
		{"clients4-10800", "", 0, false},
		{"clusterip4", "", 0, false},
	} {
		m, e, ok := adoptSize(c.kernel)
		if m != c.m || e != c.e || ok != c.ok {
			t.Errorf("adoptSize(%q) = %q %d %v, want %q %d %v", c.kernel, m, e, ok, c.m, c.e, c.ok)
		}
	}
	z := lbSizes{"lb4-10": 22}
	if got := z.kernelName("lb4-10"); got != "lb4-10-s22" {
		t.Errorf("kernelName = %q", got)
	}
	if got := z.kernelName("lb4-3"); got != "lb4-3" {
		t.Errorf("kernelName of an unsized map = %q", got)
	}
}

// TestElementsCounted: a set's count (lens) is what each yields, through
// changes that replace, drop and restore a frontend's owner, with a range
// listed twice (one element) and hairpin elements shared by two ports.
func TestElementsCounted(t *testing.T) {
	lbIP, node := "198.51.100.10", "node-a"
	lb := func(name, clusterIP string, ranges ...string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ClusterIP: clusterIP, ClusterIPs: []string{clusterIP},
				Ports:                    []corev1.ServicePort{{Name: "http", Port: 80, NodePort: 30080, Protocol: corev1.ProtocolTCP}},
				LoadBalancerSourceRanges: ranges},
			Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: lbIP}}}}}
	}
	slice := func(svc string) *discoveryv1.EndpointSlice {
		name, tcp, port, ready := "http", corev1.ProtocolTCP, int32(8080), true
		return &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: svc + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &tcp}},
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.5"}, NodeName: &node,
				Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		}
	}
	a := lb("a", "10.96.0.10", "203.0.113.0/24", "203.0.113.7/24") // the same range, masked
	b := lb("b", "10.96.0.11")                                     // claims a's LoadBalancer IP too
	r := NewRenderer(Config{NodeName: node, Families: []int{4}, NodePortIPs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}})
	for i, step := range [][]*corev1.Service{{a, b}, {b}, {a, b}, {a}, {}} {
		var slices []*discoveryv1.EndpointSlice
		for _, s := range step {
			slices = append(slices, slice(s.Name))
		}
		st, errs := model.Build(step, slices)
		if len(errs) > 0 {
			t.Fatal(errs)
		}
		rs := r.Update(st)
		for j := range rs.Sets {
			s := &rs.Sets[j]
			seen := map[packed]bool{}
			rs.each(s, func(k packed, _ packedValue) {
				if seen[k] {
					t.Errorf("step %d: set %s yields %s twice", i, s.Name, s.keyString(k))
				}
				seen[k] = true
			})
			if len(seen) != rs.len(s) {
				t.Errorf("step %d: set %s counts %d elements, yields %d", i, s.Name, rs.len(s), len(seen))
			}
		}
		if n := rs.len(&Set{Name: "firewall-allow4"}); len(step) > 0 && step[0] == a && n != 1 {
			t.Errorf("step %d: firewall-allow4 has %d elements, want 1", i, n)
		}
	}
}

// TestElemList: elements come back as they were added, in order, each
// with its set, key and value, whatever their lengths.
func TestElemList(t *testing.T) {
	var buf [44]byte
	v4, v6 := netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("fd00::1")
	want := []elem{
		{set: "lb4-2", key: toPacked(appendInt(frontend{v4, model.TCP, 80}.appendTo(buf[:0]), 1)), value: toValue(appendPort(appendAddr(buf[:0], v4), 8080))},
		{set: "clusterip4", key: frontend{v4, model.TCP, 80}.key()},
		{set: "lb6-2", key: toPacked(appendInt(frontend{v6, model.UDP, 53}.appendTo(buf[:0]), 0)), value: toValue(appendPort(appendAddr(buf[:0], v6), 5353))},
		{set: "lb4-2", key: toPacked(appendInt(frontend{v4, model.TCP, 80}.appendTo(buf[:0]), 0)), value: toValue(appendPort(appendAddr(buf[:0], v4), 8081))},
		{set: "firewall-allow6", key: toPacked(appendPrefix(frontend{v6, model.TCP, 443}.appendTo(buf[:0]), netip.MustParsePrefix("fd00::/64")))},
	}
	var l elemList
	l.grow(2)
	for _, e := range want {
		l.add(e)
	}
	var got []elem
	for e := range l.all() {
		got = append(got, e)
	}
	if len(got) != len(want) {
		t.Fatalf("got %d elements, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("element %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if len(l.sets) != 4 {
		t.Errorf("sets %v: want each set once", l.sets)
	}
	for range l.all() {
		break // a consumer may stop early
	}
}
