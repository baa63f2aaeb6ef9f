package model

import (
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

const v4, v6 = discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6

// TestBuildSlices runs each slice of default/web (or of another Service)
// next to a good one, whose endpoint must always be kept.
func TestBuildSlices(t *testing.T) {
	web := spn("default", "web", "http", TCP)
	good := slice("default", "web-good", "web", v4, eports(eport("http", 8080)), ep("10.244.9.9"))
	for _, tc := range []struct {
		name string
		es   *discoveryv1.EndpointSlice
		errs []errKey
		want []string // default/web http endpoints besides the good one
	}{
		{name: "no label", es: slice("default", "x", "", v4, eports(eport("http", 8080)), ep("10.244.0.1")),
			errs: []errKey{{"EndpointSlice", "default/x", "metadata.labels[kubernetes.io/service-name]"}}},
		{name: "unknown Service", es: slice("default", "x", "nope", v4, eports(eport("http", 8080)), ep("10.244.0.1")),
			errs: []errKey{{"EndpointSlice", "default/x", "metadata.labels[kubernetes.io/service-name]"}}},
		{name: "Service in another namespace", es: slice("other", "x", "web", v4, eports(eport("http", 8080)), ep("10.244.0.1")),
			errs: []errKey{{"EndpointSlice", "other/x", "metadata.labels[kubernetes.io/service-name]"}}},
		{name: "headless Service's slice", es: slice("default", "x", "headless", v4, eports(eport("http", 8080)), ep("bad"))},
		{name: "bad address", es: slice("default", "x", "web", v4, eports(eport("http", 8080)), ep("10.244.0.1"), ep("10.244.0.x"), ep("10.244.0.3")),
			errs: []errKey{{"EndpointSlice", "default/x", "endpoints[1].addresses[0]"}}, want: []string{"10.244.0.1:8080", "10.244.0.3:8080"}},
		{name: "first valid address", es: slice("default", "x", "web", v4, eports(eport("http", 8080)), ep("fd00::1", "10.244.0.2", "10.244.0.7")),
			errs: []errKey{{"EndpointSlice", "default/x", "endpoints[0].addresses[0]"}}, want: []string{"10.244.0.2:8080"}},
		{name: "no address", es: slice("default", "x", "web", v4, eports(eport("http", 8080)), ep(), ep("10.244.0.1")),
			errs: []errKey{{"EndpointSlice", "default/x", "endpoints[0].addresses"}}, want: []string{"10.244.0.1:8080"}},
		{name: "IPv6 address in IPv4 slice", es: slice("default", "x", "web", v4, eports(eport("http", 8080)), ep("fd00::1")),
			errs: []errKey{{"EndpointSlice", "default/x", "endpoints[0].addresses[0]"}}},
		{name: "bad slice port", es: slice("default", "x", "web", v4, eports(eport("http", 0)), ep("10.244.0.1")),
			errs: []errKey{{"EndpointSlice", "default/x", "ports[0].port"}}},
		{name: "nil slice port skipped", es: slice("default", "x", "web", v4,
			eports(discoveryv1.EndpointPort{Name: ptr("http")}, eport("http", 8081)), ep("10.244.0.1")), want: []string{"10.244.0.1:8081"}},
		{name: "other port name", es: slice("default", "x", "web", v4, eports(eport("metrics", 9090)), ep("10.244.0.1"))},
		{name: "other protocol", es: slice("default", "x", "web", v4,
			eports(discoveryv1.EndpointPort{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolUDP)}), ep("10.244.0.1"))},
		{name: "nil protocol is TCP", es: slice("default", "x", "web", v4,
			eports(discoveryv1.EndpointPort{Name: ptr("http"), Port: ptr(int32(8080))}), ep("10.244.0.1")), want: []string{"10.244.0.1:8080"}},
		{name: "FQDN slice ignored", es: slice("default", "x", "web", discoveryv1.AddressTypeFQDN, eports(eport("http", 8080)), ep("example.com"))},
		{name: "unknown address type", es: slice("default", "x", "web", "IPX", eports(eport("http", 8080)), ep("10.244.0.1")),
			errs: []errKey{{"EndpointSlice", "default/x", "addressType"}}},
		{name: "IPv6 slice for an IPv4 Service", es: slice("default", "x", "web", v6, eports(eport("http", 8080)), ep("fd00::1"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svcs := []*corev1.Service{svc("default", "web"), svc("default", "headless", withIPs(corev1.ClusterIPNone))}
			st, errs := Build(svcs, []*discoveryv1.EndpointSlice{tc.es, good})
			checkErrs(t, errs, tc.errs)
			want := append(slices.Clone(tc.want), "10.244.9.9:8080")
			slices.Sort(want)
			if got := strs(st.Endpoints[web]); !slices.Equal(got, want) {
				t.Errorf("endpoints = %v, want %v", got, want)
			}
		})
	}
}

func TestBuildConditionsAndHints(t *testing.T) {
	e := onNode(ep("10.244.0.1"), "n1", "z1")
	e.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z1"}, {Name: "z2"}}, ForNodes: []discoveryv1.ForNode{{Name: "n1"}}}
	es := slice("default", "web-1", "web", v4, eports(eport("http", 8080)),
		e,
		cond(ep("10.244.0.2"), no, nil, nil),
		cond(ep("10.244.0.3"), no, yes, yes),
		cond(ep("10.244.0.4"), yes, no, no),
	)
	st, errs := Build([]*corev1.Service{svc("default", "web")}, []*discoveryv1.EndpointSlice{es})
	checkErrs(t, errs, nil)
	want := []Endpoint{
		{IP: addrs("10.244.0.1")[0], Port: 8080, Ready: true, Serving: true, NodeName: "n1", Zone: "z1", Hints: &Hints{Zones: []string{"z1", "z2"}, Nodes: []string{"n1"}}},
		{IP: addrs("10.244.0.2")[0], Port: 8080},                                   // Serving nil follows Ready
		{IP: addrs("10.244.0.3")[0], Port: 8080, Serving: true, Terminating: true}, // draining
		{IP: addrs("10.244.0.4")[0], Port: 8080, Ready: true},                      // as given
	}
	if got := st.Endpoints[spn("default", "web", "http", TCP)]; !EqualEndpoints(got, want) {
		t.Errorf("endpoints =\n%+v\nwant\n%+v", got, want)
	}
}

func TestBuildDualStack(t *testing.T) {
	s := svc("default", "web", withIPs("fd00::10", "10.96.0.10"), withType(corev1.ServiceTypeLoadBalancer), spec(func(s *corev1.ServiceSpec) {
		s.ExternalIPs = []string{"2001:db8::1", "192.0.2.1"}
		s.LoadBalancerSourceRanges = []string{"2001:db8::/32", "10.0.0.0/8"}
	}))
	s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.1"}, {IP: "2001:db8:1::1"}}
	es4 := slice("default", "web-v4", "web", v4, eports(eport("http", 8080)), ep("10.244.0.1"))
	es6 := slice("default", "web-v6", "web", v6, eports(eport("http", 8080)), ep("fd00:244::1"), ep("10.244.0.9"))
	st, errs := Build([]*corev1.Service{s}, []*discoveryv1.EndpointSlice{es6, es4})
	checkErrs(t, errs, []errKey{{"EndpointSlice", "default/web-v6", "endpoints[1].addresses[0]"}})
	name := spn("default", "web", "http", TCP)
	sp := st.Ports[name]
	if sp == nil {
		t.Fatal("no port")
	}
	if !slices.Equal(sp.ClusterIPs, addrs("fd00::10", "10.96.0.10")) || len(sp.ExternalIPs) != 2 || len(sp.LoadBalancerIPs) != 2 || len(sp.SourceRanges) != 2 {
		t.Errorf("port = %+v", sp)
	}
	if got, want := strs(st.Endpoints[name]), []string{"10.244.0.1:8080", "[fd00:244::1]:8080"}; !slices.Equal(got, want) {
		t.Errorf("endpoints = %v, want %v", got, want)
	}
}

// TestBuildNamedPorts: a named targetPort resolves per pod, so slices give
// the same port name different numbers; a name also exists per protocol.
func TestBuildNamedPorts(t *testing.T) {
	s := svc("default", "dns", withPorts(
		corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
		corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolTCP},
		corev1.ServicePort{Name: "metrics", Port: 9153},
	))
	udp := func(name string, port int32) discoveryv1.EndpointPort {
		return discoveryv1.EndpointPort{Name: ptr(name), Port: ptr(port), Protocol: ptr(corev1.ProtocolUDP)}
	}
	es := []*discoveryv1.EndpointSlice{
		slice("default", "dns-a", "dns", v4, eports(udp("dns", 5353), eport("dns", 5353), eport("metrics", 9153)), ep("10.244.0.2"), ep("10.244.0.1")),
		slice("default", "dns-b", "dns", v4, eports(eport("metrics", 9154), udp("dns", 53)), ep("10.244.1.1")),
		slice("default", "dns-c", "dns", v4, eports(eport("other", 1)), ep("10.244.2.1")),
	}
	st, errs := Build([]*corev1.Service{s}, es)
	checkErrs(t, errs, nil)
	for name, want := range map[ServicePortName][]string{
		spn("default", "dns", "dns", UDP):     {"10.244.0.1:5353", "10.244.0.2:5353", "10.244.1.1:53"},
		spn("default", "dns", "dns", TCP):     {"10.244.0.1:5353", "10.244.0.2:5353"},
		spn("default", "dns", "metrics", TCP): {"10.244.0.1:9153", "10.244.0.2:9153", "10.244.1.1:9154"},
	} {
		if got := strs(st.Endpoints[name]); !slices.Equal(got, want) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if len(st.Ports) != 3 {
		t.Errorf("%d ports", len(st.Ports))
	}
}

// TestBuildDedup: an endpoint in two slices (moving between them, or an IP
// reused by a new pod) is kept once, the better one winning in any order.
func TestBuildDedup(t *testing.T) {
	old := onNode(cond(ep("10.244.0.1"), no, yes, yes), "n-old", "")
	fresh := onNode(ep("10.244.0.1"), "n-new", "")
	notServing := onNode(cond(ep("10.244.0.2"), no, no, yes), "n-old", "")
	serving := onNode(cond(ep("10.244.0.2"), no, yes, yes), "n-new", "")
	a := slice("default", "web-a", "web", v4, eports(eport("http", 8080)), old, notServing, ep("10.244.0.3"))
	b := slice("default", "web-b", "web", v4, eports(eport("http", 8080)), fresh, serving, ep("10.244.0.3"))
	for _, order := range [][]*discoveryv1.EndpointSlice{{a, b}, {b, a}} {
		st, _ := Build([]*corev1.Service{svc("default", "web")}, order)
		got := st.Endpoints[spn("default", "web", "http", TCP)]
		if s := strs(got); !slices.Equal(s, []string{"10.244.0.1:8080", "10.244.0.2:8080", "10.244.0.3:8080"}) {
			t.Fatalf("endpoints = %v", s)
		}
		if got[0].NodeName != "n-new" || !got[0].Ready || got[1].NodeName != "n-new" || !got[1].Serving {
			t.Errorf("kept %+v and %+v", got[0], got[1])
		}
	}
}

// TestBuildOrderIndependent: shuffling the inputs changes nothing, errors
// included.
func TestBuildOrderIndependent(t *testing.T) {
	svcs := []*corev1.Service{
		svc("a", "web"), svc("b", "web", withIPs("10.96.0.300")), svc("a", "api", withIPs("10.96.0.11"), withPorts(corev1.ServicePort{Port: 0})),
		svc("c", "dual", withIPs("10.96.0.12", "fd00::12")),
	}
	es := []*discoveryv1.EndpointSlice{
		slice("a", "web-1", "web", v4, eports(eport("http", 80)), ep("10.244.0.1"), ep("bad")),
		slice("a", "web-2", "web", v4, eports(eport("http", 80)), ep("10.244.0.2")),
		slice("a", "orphan", "gone", v4, nil),
		slice("a", "nolabel", "", v4, nil),
		slice("c", "dual-6", "dual", v6, eports(eport("http", 80)), ep("fd00:244::1")),
		slice("c", "dual-4", "dual", v4, eports(eport("http", 80)), ep("10.244.3.1")),
	}
	st0, errs0 := Build(svcs, es)
	if len(errs0) != 5 || len(st0.Ports) != 2 {
		t.Fatalf("%d ports, errors %v", len(st0.Ports), errs0)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		r.Shuffle(len(svcs), func(i, j int) { svcs[i], svcs[j] = svcs[j], svcs[i] })
		r.Shuffle(len(es), func(i, j int) { es[i], es[j] = es[j], es[i] })
		st, errs := Build(svcs, es)
		if !reflect.DeepEqual(st, st0) || !reflect.DeepEqual(errs, errs0) {
			t.Fatalf("order changed the result:\n%v\n%v", errs, errs0)
		}
	}
}
