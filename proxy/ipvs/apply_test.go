package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	libipvs "github.com/moby/ipvs"

	"github.com/weftnet/weft/proxy/model"
)

const nodeName = "node-a"

func testConfig() Config {
	return Config{NodeName: nodeName, Families: []int{4}, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}
}

func vsKey(addr string, port uint16) VSKey {
	return VSKey{Addr: netip.MustParseAddr(addr), Proto: model.TCP, Port: port}
}

// fakeKernel is an IPVS table in memory, with the connection counts of
// each real server set by the test.
type fakeKernel struct {
	svcs  map[VSKey]*libipvs.Service
	dests map[VSKey]map[Dest]*libipvs.Destination
	fail  error // returned by NewService when set
}

func newFake() *fakeKernel {
	return &fakeKernel{svcs: map[VSKey]*libipvs.Service{}, dests: map[VSKey]map[Dest]*libipvs.Destination{}}
}

func svcKey(s *libipvs.Service) VSKey {
	p, _ := protoName(s.Protocol)
	return VSKey{Addr: addrOf(s.Address), Proto: p, Port: s.Port}
}

func (f *fakeKernel) GetServices() ([]*libipvs.Service, error) {
	var out []*libipvs.Service
	for _, s := range f.svcs {
		c := *s
		c.Flags |= 0x2 // the kernel reports IP_VS_SVC_F_HASHED
		out = append(out, &c)
	}
	return out, nil
}

func (f *fakeKernel) GetDestinations(s *libipvs.Service) ([]*libipvs.Destination, error) {
	var out []*libipvs.Destination
	for _, d := range f.dests[svcKey(s)] {
		c := *d
		out = append(out, &c)
	}
	return out, nil
}

func (f *fakeKernel) NewService(s *libipvs.Service) error {
	if f.fail != nil {
		return f.fail
	}
	k := svcKey(s)
	if f.svcs[k] != nil {
		return errors.New("file exists")
	}
	f.svcs[k], f.dests[k] = s, map[Dest]*libipvs.Destination{}
	return nil
}

func (f *fakeKernel) UpdateService(s *libipvs.Service) error {
	if f.svcs[svcKey(s)] == nil {
		return errors.New("no such service")
	}
	f.svcs[svcKey(s)] = s
	return nil
}

func (f *fakeKernel) DelService(s *libipvs.Service) error {
	delete(f.svcs, svcKey(s))
	delete(f.dests, svcKey(s))
	return nil
}

func destOf(d *libipvs.Destination) Dest { return Dest{Addr: addrOf(d.Address), Port: d.Port} }

func (f *fakeKernel) NewDestination(s *libipvs.Service, d *libipvs.Destination) error {
	m := f.dests[svcKey(s)]
	if m == nil || m[destOf(d)] != nil {
		return fmt.Errorf("adding %s to %s", destOf(d), svcKey(s))
	}
	m[destOf(d)] = d
	return nil
}

func (f *fakeKernel) UpdateDestination(s *libipvs.Service, d *libipvs.Destination) error {
	cur := f.dests[svcKey(s)][destOf(d)]
	if cur == nil {
		return fmt.Errorf("updating %s of %s", destOf(d), svcKey(s))
	}
	cur.Weight = d.Weight
	return nil
}

func (f *fakeKernel) DelDestination(s *libipvs.Service, d *libipvs.Destination) error {
	delete(f.dests[svcKey(s)], destOf(d))
	return nil
}

// services is a state of n ClusterIP Services with one TCP port and two
// local endpoints each, and one UDP Service.
func services(n int, extra ...string) model.State {
	st := model.State{Ports: map[model.ServicePortName]*model.ServicePort{}, Endpoints: map[model.ServicePortName][]model.Endpoint{}}
	for i := range n {
		name := model.ServicePortName{Namespace: "default", Name: fmt.Sprintf("s%d", i), Protocol: model.TCP}
		st.Ports[name] = &model.ServicePort{Name: name, ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})}, Port: 80, Protocol: model.TCP}
		for _, ip := range append([]string{"10.244.1.2", "10.244.1.3"}, extra...) {
			st.Endpoints[name] = append(st.Endpoints[name], model.Endpoint{IP: netip.MustParseAddr(ip), Port: 8080, Ready: true, NodeName: nodeName})
		}
	}
	dns := model.ServicePortName{Namespace: "default", Name: "dns", Protocol: model.UDP}
	st.Ports[dns] = &model.ServicePort{Name: dns, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.255.53")}, Port: 53, Protocol: model.UDP}
	st.Endpoints[dns] = []model.Endpoint{{IP: netip.MustParseAddr("10.244.1.2"), Port: 53, Ready: true, NodeName: nodeName}}
	return st
}

// withEndpoints replaces the endpoints of the named service's port.
func withEndpoints(st model.State, svc string, proto model.Protocol, port uint16, ips ...string) model.State {
	out := model.State{Ports: st.Ports, Endpoints: map[model.ServicePortName][]model.Endpoint{}}
	for k, v := range st.Endpoints {
		out.Endpoints[k] = v
	}
	name := model.ServicePortName{Namespace: "default", Name: svc, Protocol: proto}
	out.Endpoints[name] = nil
	for _, ip := range ips {
		out.Endpoints[name] = append(out.Endpoints[name], model.Endpoint{IP: netip.MustParseAddr(ip), Port: port, Ready: true, NodeName: nodeName})
	}
	return out
}

// syncPlan applies st through a plan, as Backend.Sync does without the
// kernel's links and nftables.
func syncPlan(t *testing.T, k *countingKernel, applied map[VSKey]*appliedVS, term map[destKey]time.Time, st model.State, now time.Time) int {
	t.Helper()
	k.ops = 0
	p := &ipvsPlan{k: k, applied: applied, terminating: term, grace: time.Minute, now: now}
	if err := p.apply(Render(testConfig(), st).Servers); err != nil {
		t.Fatal(err)
	}
	if err := p.reap(); err != nil {
		t.Fatal(err)
	}
	return k.ops
}

// TestNetlinkOpsPerEndpointChange: an endpoint change costs the same
// netlink requests with 10 Services as with 1000.
func TestNetlinkOpsPerEndpointChange(t *testing.T) {
	for _, n := range []int{10, 1000} {
		k := &countingKernel{Kernel: newFake()}
		applied, term := map[VSKey]*appliedVS{}, map[destKey]time.Time{}
		st := services(n)
		if ops := syncPlan(t, k, applied, term, st, time.Now()); ops != 3*n+2 {
			t.Fatalf("%d services: the first sync made %d requests, want %d (a service and two real servers each, and the UDP one)", n, ops, 3*n+2)
		}
		added := withEndpoints(st, "s1", model.TCP, 8080, "10.244.1.2", "10.244.1.3", "10.244.1.4")
		if ops := syncPlan(t, k, applied, term, added, time.Now()); ops != 1 {
			t.Errorf("%d services: adding an endpoint made %d requests, want 1", n, ops)
		}
	}
}

// TestGracefulTermination: a real server leaving a TCP virtual server gets
// weight 0 and stays while it has connections, up to the grace period; one
// leaving a UDP virtual server goes at once; one coming back gets its
// weight again.
func TestGracefulTermination(t *testing.T) {
	fake := newFake()
	k := &countingKernel{Kernel: fake}
	applied, term := map[VSKey]*appliedVS{}, map[destKey]time.Time{}
	st := services(1)
	t0 := time.Now()
	syncPlan(t, k, applied, term, st, t0)
	vs := vsKey("10.96.0.0", 80)
	b := Dest{Addr: netip.MustParseAddr("10.244.1.3"), Port: 8080}
	fake.dests[vs][b].ActiveConnections = 1

	removed := withEndpoints(st, "s0", model.TCP, 8080, "10.244.1.2")
	syncPlan(t, k, applied, term, removed, t0)
	if d := fake.dests[vs][b]; d == nil || d.Weight != 0 {
		t.Fatalf("the removed real server with a connection: %+v, want it kept with weight 0", d)
	}
	syncPlan(t, k, applied, term, removed, t0.Add(30*time.Second))
	if fake.dests[vs][b] == nil {
		t.Fatal("deleted within the grace period while it has a connection")
	}
	syncPlan(t, k, applied, term, st, t0.Add(31*time.Second))
	if d := fake.dests[vs][b]; d == nil || d.Weight != 1 || len(term) != 0 {
		t.Fatalf("back in the Service: %+v (terminating %v), want weight 1", d, term)
	}
	syncPlan(t, k, applied, term, removed, t0.Add(40*time.Second))
	fake.dests[vs][b].ActiveConnections = 0
	syncPlan(t, k, applied, term, removed, t0.Add(41*time.Second))
	if fake.dests[vs][b] != nil {
		t.Fatal("kept after its connections ended")
	}
	fake.dests[vs][Dest{Addr: netip.MustParseAddr("10.244.1.2"), Port: 8080}].ActiveConnections = 5
	syncPlan(t, k, applied, term, withEndpoints(st, "s0", model.TCP, 8080), t0.Add(50*time.Second))
	syncPlan(t, k, applied, term, withEndpoints(st, "s0", model.TCP, 8080), t0.Add(111*time.Second))
	if len(fake.dests[vs]) != 0 {
		t.Fatalf("kept past the grace period: %v", fake.dests[vs])
	}
	dns := VSKey{Addr: netip.MustParseAddr("10.96.255.53"), Proto: model.UDP, Port: 53}
	fake.dests[dns][Dest{Addr: netip.MustParseAddr("10.244.1.2"), Port: 53}].ActiveConnections = 1
	syncPlan(t, k, applied, term, withEndpoints(st, "dns", model.UDP, 53, "10.244.1.4"), t0.Add(112*time.Second))
	if _, ok := fake.dests[dns][Dest{Addr: netip.MustParseAddr("10.244.1.2"), Port: 53}]; ok || len(fake.dests[dns]) != 1 {
		t.Fatalf("UDP real servers %v, want only the new one", fake.dests[dns])
	}
}

// TestRestartReadsTheKernel: a restarted backend (a full sync from the
// kernel's table) writes nothing for an unchanged state, deletes virtual
// servers it owns that are gone, and keeps other users' ones.
func TestRestartReadsTheKernel(t *testing.T) {
	fake := newFake()
	k := &countingKernel{Kernel: fake}
	st := services(5)
	syncPlan(t, k, map[VSKey]*appliedVS{}, map[destKey]time.Time{}, st, time.Now())
	foreign := toService(vsKey("192.168.7.7", 443), "wlc", 0)
	if err := fake.NewService(foreign); err != nil {
		t.Fatal(err)
	}
	d := Render(testConfig(), st)
	owned := func(a netip.Addr) bool { return a != netip.MustParseAddr("192.168.7.7") }
	applied, err := readKernel(k, owned)
	if err != nil {
		t.Fatal(err)
	}
	k.ops = 0
	p := &ipvsPlan{k: k, applied: applied, terminating: map[destKey]time.Time{}, grace: time.Minute, now: time.Now()}
	if err := p.apply(d.Servers); err != nil || k.ops != 0 {
		t.Fatalf("the restarted backend's sync of an unchanged state made %d requests (%v), want 0", k.ops, err)
	}
	delete(d.Servers, vsKey("10.96.0.1", 80))
	if err := p.apply(d.Servers); err != nil || k.ops != 1 || fake.svcs[vsKey("10.96.0.1", 80)] != nil {
		t.Fatalf("a removed service: %d requests (%v), want 1 deletion", k.ops, err)
	}
	if fake.svcs[vsKey("192.168.7.7", 443)] == nil {
		t.Fatal("another user's virtual server was deleted")
	}
}

// TestNetlinkErrorNamesTheVirtualServer: a refused virtual server's error
// names it, its service and its scheduler.
func TestNetlinkErrorNamesTheVirtualServer(t *testing.T) {
	fake := newFake()
	fake.fail = errors.New("no such file or directory")
	p := &ipvsPlan{k: fake, applied: map[VSKey]*appliedVS{}, terminating: map[destKey]time.Time{}, now: time.Now()}
	err := p.apply(Render(testConfig(), services(1)).Servers)
	if err == nil || !strings.Contains(err.Error(), "virtual server 10.96.0.0:80/TCP") && !strings.Contains(err.Error(), "virtual server 10.96.255.53:53/UDP") ||
		!strings.Contains(err.Error(), "scheduler rr") || !errors.Is(err, fake.fail) {
		t.Fatalf("got %v, want an error naming the virtual server, its service and scheduler", err)
	}
}

// TestBadScheduler: a scheduler IPVS does not have is refused naming the
// flag.
func TestBadScheduler(t *testing.T) {
	err := CheckScheduler("fastest")
	if err == nil || !strings.Contains(err.Error(), "--ipvs-scheduler") || !strings.Contains(err.Error(), `"fastest"`) {
		t.Fatalf("got %v, want an error naming --ipvs-scheduler and the value", err)
	}
	if err := CheckScheduler(""); err != nil {
		t.Fatalf("the default scheduler: %v", err)
	}
}
