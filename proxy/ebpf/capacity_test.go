package ebpf_test

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/weftnet/weft/internal/testutil"
	weftebpf "github.com/weftnet/weft/proxy/ebpf"
	"github.com/weftnet/weft/proxy/model"
	"github.com/weftnet/weft/proxy/proxytest"
)

// The Services of the capacity tests: Service i has ClusterIP
// 10.96.1.<i+1> and two ports (80, 81) with pods a and b as endpoints, so
// that it takes 6 entries of the services map (two frontends, each a
// master entry and 2 slots) when written into empty maps, and the
// backends map holds the 4 of a and b.
const entriesPerService = 6

func capacityService(i int) string { return fmt.Sprintf("10.96.1.%d", i+1) }

// setServices makes n's Services 0..count-1 (see above).
func setServices(n *proxytest.Node, count int) {
	n.Svcs, n.Slices = nil, nil
	for i := range count {
		name := fmt.Sprintf("s%d", i)
		n.Svcs = append(n.Svcs, proxytest.Service(name, capacityService(i), nil))
		n.Slices = append(n.Slices, proxytest.Slice(name, n.Local("a"), n.Local("b")))
	}
}

// syncErr programs n's Services through its backend and returns the
// error of the sync.
func syncErr(t *testing.T, n *proxytest.Node) error {
	t.Helper()
	st, errs := model.Build(n.Svcs, n.Slices)
	if len(errs) > 0 {
		t.Fatalf("building the model: %v", errs)
	}
	return n.Backend.Sync(st, false)
}

// answers fails the test unless Services i of is answer from a pod.
func answers(t *testing.T, n *proxytest.Node, when string, is ...int) {
	t.Helper()
	for _, i := range is {
		if r, err := proxytest.Get(n.Pods["a"].NS, "", "http://"+capacityService(i)+"/"); err != nil || (r.Pod != "a" && r.Pod != "b") {
			t.Errorf("%s: Service s%d: %+v %v, want a or b", when, i, r, err)
		}
	}
}

// wantCapacityError fails the test unless err is a refused sync naming
// map weft_services, what it needs and holds, and the flag.
func wantCapacityError(t *testing.T, err error, needed, capacity int) {
	t.Helper()
	var ce *weftebpf.CapacityError
	if !errors.As(err, &ce) || ce.Map != "weft_services" || ce.Needed != needed || ce.Capacity != capacity {
		t.Fatalf("sync: %v, want weft_services needing %d entries, holding %d", err, needed, capacity)
	}
	for _, want := range []string{"weft_services", fmt.Sprint(needed), fmt.Sprint(capacity), "--bpf-lb-map-max", "nothing written"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error %q lacks %q", err, want)
		}
	}
}

// maxEntries is the capacity of the map pinned as name.
func maxEntries(t *testing.T, name string) int {
	t.Helper()
	return int(pinnedMap(t, filepath.Join(envs[t].pin, name)).MaxEntries())
}

// TestMapCapacity: with --bpf-lb-map-max 1024, a state that fits (100
// Services, 600 entries of the services map) is programmed; one that does
// not (200 Services, 1,200 entries) is refused whole with an error naming
// the map, what it needs and holds and the flag: nothing of it is written,
// the Services of the first state still answer, and the metrics show the
// need above the maximum. Back to the first state, the next sync succeeds.
// Then the proxier on the same maps: its health fails while its state does
// not fit, and its sync error counter counts the refusals.
func TestMapCapacity(t *testing.T) {
	n := proxytest.NewNode(t, backend, "a", "b")
	_ = n.Backend.Cleanup()
	n.Config.BPFLBMax = weftebpf.MinLBMax
	n.Backend = n.NewBackend()
	b := n.Backend.(*weftebpf.Backend)
	setServices(n, 100)
	n.Sync()
	if got := maxEntries(t, "weft_services"); got != weftebpf.MinLBMax {
		t.Fatalf("weft_services holds %d entries at most, want --bpf-lb-map-max's %d", got, weftebpf.MinLBMax)
	}
	answers(t, n, "the first state", 0, 99)
	setServices(n, 200)
	wantCapacityError(t, syncErr(t, n), 200*entriesPerService, weftebpf.MinLBMax)
	pin := envs[t].pin
	if got := entries(t, filepath.Join(pin, "weft_services")); got != 100*entriesPerService {
		t.Errorf("after the refused sync the services map holds %d entries, want the first state's %d", got, 100*entriesPerService)
	}
	r, err := weftebpf.OpenReader(pin)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	refused := weftebpf.FrontendKey{Addr: netip.MustParseAddr(capacityService(100)), Port: 80, Protocol: model.TCP}
	if got, err := r.Backends(refused); err != nil || got != nil {
		t.Errorf("a frontend of the refused state: %v %v, want none written", got, err)
	}
	answers(t, n, "after the refused sync", 0, 99)
	for name, want := range map[string]float64{"weft_ebpf_map_entries_needed": 200 * entriesPerService,
		"weft_ebpf_map_max_entries": weftebpf.MinLBMax, "weft_ebpf_map_entries": 100 * entriesPerService} {
		if got, ok := metricValue(t, b, name, "map", "weft_services"); !ok || got != want {
			t.Errorf("weft_services: %s %v (present %v), want %v", name, got, ok, want)
		}
	}
	setServices(n, 100)
	n.Sync()
	answers(t, n, "back to the first state", 0, 99)

	// The proxier (a restart on the same maps).
	b.Close()
	p := proxytest.RunProxier(t, n.Config)
	for i := range 100 {
		p.OnService(nil, n.Svcs[i])
		p.OnEndpointSlice(nil, n.Slices[i])
	}
	p.OnSynced()
	testutil.Eventually(t, 10*time.Second, "the proxier's first sync", p.Healthy)
	setServices(n, 200)
	for i := 100; i < 200; i++ {
		p.OnService(nil, n.Svcs[i])
		p.OnEndpointSlice(nil, n.Slices[i])
	}
	testutil.Eventually(t, 10*time.Second, "the proxier unhealthy with a state that does not fit", func() bool { return !p.Healthy() })
	if got := syncFailures(t, p.Metrics().Registry); got < 1 {
		t.Errorf("sync failures counted: %v, want at least the refused sync", got)
	}
	answers(t, n, "while the proxier's state does not fit", 0, 99)
	for i := 100; i < 200; i++ {
		p.OnService(n.Svcs[i], nil)
		p.OnEndpointSlice(n.Slices[i], nil)
	}
	testutil.Eventually(t, 10*time.Second, "the proxier healthy again once its state fits", p.Healthy)
}

// syncFailures is the proxier's count of failed syncs.
func syncFailures(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "kubeproxy_sync_proxy_rules_iptables_restore_failures_total" {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

// TestPinnedMapsOfAnotherSize: a restart with another --bpf-lb-map-max
// finds the service maps pinned at the earlier size (as an upgrade finds
// those of the fixed sizes of earlier versions). It fills new maps while
// the earlier programs go on serving from the old ones (after its
// Prepare, the pins and the programs are the earlier ones, and the
// Services answer), then swaps its programs in and pins the new maps. A
// restart whose capacity is too small for the state refuses its first
// sync and leaves the earlier programs serving from the earlier maps.
func TestPinnedMapsOfAnotherSize(t *testing.T) {
	n := proxytest.NewNode(t, backend, "a", "b")
	cg := envs[t].cgroup
	restart := func(lbMax int) *weftebpf.Backend {
		n.Backend.(*weftebpf.Backend).Close()
		n.Config.BPFLBMax = lbMax
		n.Backend = n.NewBackend()
		return n.Backend.(*weftebpf.Backend)
	}
	_ = n.Backend.Cleanup()
	restart(2 * weftebpf.MinLBMax)
	setServices(n, 200)
	n.Sync()
	answers(t, n, "at 2048", 0, 199)
	before := programIDs(t, cg, ebpf.AttachCGroupInet4Connect)

	b := restart(4 * weftebpf.MinLBMax)
	if err := b.Prepare(); err != nil {
		t.Fatal(err)
	}
	if got := maxEntries(t, "weft_services"); got != 2*weftebpf.MinLBMax {
		t.Fatalf("after a restarted backend's Prepare the pinned weft_services holds %d entries at most, want the earlier %d", got, 2*weftebpf.MinLBMax)
	}
	if ids := programIDs(t, cg, ebpf.AttachCGroupInet4Connect); !slices.Equal(ids, before) {
		t.Fatalf("connect4 programs %v after a restarted backend's Prepare, want the earlier %v", ids, before)
	}
	answers(t, n, "after a restarted backend's Prepare", 0, 199)
	n.Sync()
	for name, want := range weftebpf.LBCapacities(4 * weftebpf.MinLBMax) {
		if got := maxEntries(t, name); got != want {
			t.Errorf("after the restart's first sync the pinned %s holds %d entries at most, want %d", name, got, want)
		}
	}
	after := programIDs(t, cg, ebpf.AttachCGroupInet4Connect)
	if len(after) != 1 || after[0] == before[0] {
		t.Fatalf("connect4 programs %v before the restart, %v after: want one, replaced", before, after)
	}
	if got := entries(t, filepath.Join(envs[t].pin, "weft_services")); got != 200*entriesPerService {
		t.Errorf("the new services map holds %d entries, want %d", got, 200*entriesPerService)
	}
	answers(t, n, "after the restart's first sync", 0, 199)

	restart(weftebpf.MinLBMax)
	wantCapacityError(t, syncErr(t, n), 200*entriesPerService, weftebpf.MinLBMax)
	if ids := programIDs(t, cg, ebpf.AttachCGroupInet4Connect); !slices.Equal(ids, after) {
		t.Errorf("connect4 programs %v after a refused first sync, want the earlier %v", ids, after)
	}
	if got := maxEntries(t, "weft_services"); got != 4*weftebpf.MinLBMax {
		t.Errorf("after a refused first sync the pinned weft_services holds %d entries at most, want the earlier %d", got, 4*weftebpf.MinLBMax)
	}
	answers(t, n, "after a refused first sync", 0, 199)
}

// TestManyServices: with the default capacities (from the node's
// memory), 25,000 Services of two ports and 10 endpoints each (the last
// one's on pod a) are programmed completely by one sync: 550,000 entries
// of the services map and 500,000 backends, beyond the fixed sizes of
// earlier versions (524,288 and 262,144). The last Service's frontends
// hold their backends, as does the one before it, and the last answers.
// The ClusterIPs are numbered from 10.96.0.1, the endpoints of the others
// (pods of other nodes) from 10.128.0.0. With WEFT_EBPF_SERVICES=N it
// programs N Services instead (100000: 2.2 million entries of the
// services map, 2 million backends) and logs the time.
func TestManyServices(t *testing.T) {
	services, endpoints := 25_000, 10
	if v := os.Getenv("WEFT_EBPF_SERVICES"); v != "" {
		var err error
		if services, err = strconv.Atoi(v); err != nil || services < 2 {
			t.Fatalf("WEFT_EBPF_SERVICES=%q: want a number of Services", v)
		}
	}
	n := proxytest.NewNode(t, backend, "a")
	addr := func(from string, i int) string {
		b := netip.MustParseAddr(from).As4()
		a := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) + uint32(i)
		return netip.AddrFrom4([4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), byte(a)}).String()
	}
	n.Svcs = make([]*corev1.Service, services)
	n.Slices = make([]*discoveryv1.EndpointSlice, services)
	for i := range services {
		name := fmt.Sprintf("s%d", i)
		n.Svcs[i] = proxytest.Service(name, addr("10.96.0.1", i), nil)
		eps := make([]proxytest.Endpoint, endpoints)
		for j := range eps {
			eps[j] = proxytest.Endpoint{IP: addr("10.128.0.0", i*endpoints+j), Node: proxytest.OtherNode}
		}
		if i == services-1 {
			eps = []proxytest.Endpoint{n.Local("a")}
		}
		n.Slices[i] = proxytest.Slice(name, eps...)
	}
	start := time.Now()
	n.Sync()
	t.Logf("%d Services of %d endpoints programmed in %v", services, endpoints, time.Since(start))
	b := n.Backend.(*weftebpf.Backend)
	wantSlots := (services-1)*2*endpoints + 2
	if got, _ := metricValue(t, b, "weft_ebpf_map_entries", "map", "weft_services"); int(got) != wantSlots+2*services {
		t.Errorf("weft_services holds %v entries, want %d", got, wantSlots+2*services)
	}
	if got, _ := metricValue(t, b, "weft_ebpf_map_entries", "map", "weft_backends"); int(got) != wantSlots {
		t.Errorf("weft_backends holds %v entries, want %d", got, wantSlots)
	}
	r, err := weftebpf.OpenReader(envs[t].pin)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, i := range []int{services - 2, services - 1} {
		st, _ := model.Build(n.Svcs[i:i+1], n.Slices[i:i+1])
		for _, port := range []uint16{80, 81} {
			k := weftebpf.FrontendKey{Addr: netip.MustParseAddr(n.Svcs[i].Spec.ClusterIP), Port: port, Protocol: model.TCP}
			want := weftebpf.Render(weftebpf.Config{NodeName: proxytest.NodeName}, st)[k].Backends
			if got, err := r.Backends(k); err != nil || len(got) == 0 || !slices.Equal(got, want) {
				t.Errorf("Service s%d, frontend %s: backends %v %v, want %v", i, k, got, err, want)
			}
		}
	}
	if got, err := proxytest.Get(n.Pods["a"].NS, "", "http://"+n.Svcs[services-1].Spec.ClusterIP+"/"); err != nil || got.Pod != "a" {
		t.Errorf("the last Service: %+v %v, want a", got, err)
	}
	// The kernel memory of the maps (make bench logs it at 10k and 100k).
	var total float64
	var each []string
	for _, name := range []string{"weft_services", "weft_backends", "weft_revnat", "weft_affinity", "weft_affinity_members",
		"weft_ct", "weft_nat_rev", "weft_src_ranges", "weft_maglev", "weft_ext_affinity"} {
		v, ok := metricValue(t, b, "weft_ebpf_map_memory_bytes", "map", name)
		if !ok {
			t.Fatalf("no weft_ebpf_map_memory_bytes for %s", name)
		}
		total += v
		each = append(each, fmt.Sprintf("%s %.1f", name, v/(1<<20)))
	}
	if svc, _ := metricValue(t, b, "weft_ebpf_map_memory_bytes", "map", "weft_services"); svc < float64(wantSlots)*16 {
		t.Errorf("weft_services takes %v bytes for %d entries: the kernel counts more", svc, wantSlots)
	}
	t.Logf("maps' kernel memory at %d Services x %d endpoints: %.1f MiB (%s MiB)", services, endpoints, total/(1<<20), strings.Join(each, ", "))
}

// TestFlowMapsResized: the socket programs' flow maps take --bpf-ct-max,
// and a restart with another size migrates them: a UDP socket connected
// through a ClusterIP before it still sees the ClusterIP as its peer
// (getpeername reads weft_revnat), as does a new one.
func TestFlowMapsResized(t *testing.T) {
	n := proxytest.NewNode(t, backend, "a")
	restart := func(ctMax int) {
		n.Backend.(*weftebpf.Backend).Close()
		n.Config.BPFCTMax = ctMax
		n.Backend = n.NewBackend()
		n.Sync()
		for _, name := range []string{"weft_revnat", "weft_affinity", "weft_ext_affinity"} {
			if got := maxEntries(t, name); got != ctMax {
				t.Fatalf("with --bpf-ct-max %d the pinned %s holds %d entries at most", ctMax, name, got)
			}
		}
	}
	_ = n.Backend.Cleanup()
	n.Svcs = []*corev1.Service{proxytest.Service("dns", "10.96.0.53", func(s *corev1.Service) {
		s.Spec.Ports = []corev1.ServicePort{{Name: "dns", Port: 81, Protocol: corev1.ProtocolUDP}}
	})}
	n.Slices = []*discoveryv1.EndpointSlice{proxytest.UDPSlice("dns", n.Pods["a"].IP.String())}
	restart(4096)
	peer := func(c net.Conn) string {
		t.Helper()
		raw, err := c.(*net.UDPConn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var sa unix.Sockaddr
		var perr error
		if err := raw.Control(func(fd uintptr) { sa, perr = unix.Getpeername(int(fd)) }); err != nil || perr != nil {
			t.Fatal(err, perr)
		}
		in, ok := sa.(*unix.SockaddrInet4)
		if !ok {
			t.Fatalf("getpeername: %#v", sa)
		}
		return net.JoinHostPort(net.IP(in.Addr[:]).String(), strconv.Itoa(in.Port))
	}
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("udp", "10.96.0.53:81")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if got := peer(c); got != "10.96.0.53:81" {
			t.Fatalf("a new socket's peer is %s, want the ClusterIP", got)
		}
		return c
	}
	before := dial()
	restart(8192)
	if got := peer(before); got != "10.96.0.53:81" {
		t.Errorf("after the flow maps were resized, a socket connected before has %s as its peer, want the ClusterIP", got)
	}
	dial()
}
