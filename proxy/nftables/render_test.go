package nftables_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/knftables"

	"github.com/weftnet/weft/proxy/model"
	"github.com/weftnet/weft/proxy/nftables"
	"github.com/weftnet/weft/proxy/proxytest"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// nodeConfig is the renderer's view of the test node, dual-stack, as
// proxy.Build derives it from the node's proxy.Config.
func nodeConfig() nftables.Config {
	return nftables.Config{NodeName: proxytest.NodeName, Families: []int{4, 6},
		NodePortIPs:  []netip.Addr{netip.MustParseAddr(proxytest.NodeIP), netip.MustParseAddr(proxytest.NodeIP6)},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix(proxytest.Cluster), netip.MustParsePrefix(proxytest.Cluster6)}}
}

// goldenScenario is the shared scenario plus what it lacks for the
// renderer: a dual-stack Service, a ClientIP timeout other than the
// default, and a Service with more endpoints than the preset maps cover.
func goldenScenario() ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
	svcs, sl := proxytest.Scenario()
	svcs = append(svcs,
		proxytest.Service("dual", "10.96.0.20", func(s *corev1.Service) {
			s.Spec.ClusterIPs = []string{"10.96.0.20", "fd00:96::20"}
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		}),
		proxytest.Service("short", "10.96.0.22", func(s *corev1.Service) {
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			t := int32(60)
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &t}}
		}),
		proxytest.Service("big", "10.96.0.23", nil))
	v6 := proxytest.Slice("dual", proxytest.Endpoint{IP: "fd00:10:244:1::3", Node: proxytest.NodeName})
	v6.Name, v6.AddressType = "dual-v6", discoveryv1.AddressTypeIPv6
	var big []proxytest.Endpoint
	for i := range 17 {
		big = append(big, proxytest.Endpoint{IP: fmt.Sprintf("10.244.2.%d", 10+i), Node: proxytest.OtherNode})
	}
	sl = append(sl, proxytest.Slice("dual", proxytest.Endpoint{IP: proxytest.PodB, Node: proxytest.NodeName}), v6,
		proxytest.Slice("short", proxytest.Endpoint{IP: proxytest.PodC, Node: proxytest.NodeName}), proxytest.Slice("big", big...))
	return svcs, sl
}

func build(t *testing.T, svcs []*corev1.Service, sl []*discoveryv1.EndpointSlice) model.State {
	t.Helper()
	st, errs := model.Build(svcs, sl)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	return st
}

// dump applies a render of st from scratch to an empty fake table.
func dump(t *testing.T, st model.State) string {
	t.Helper()
	fake := knftables.NewFake(knftables.InetFamily, nftables.TableName)
	if err := nftables.NewWith(nodeConfig(), fake).Sync(st, true); err != nil {
		t.Fatal(err)
	}
	return fake.Dump()
}

// sameTable compares two dumps whatever the order of their elements (the
// fake keeps elements in the order they were added).
func sameTable(t *testing.T, what, want, got string) {
	t.Helper()
	sorted := func(s string) string {
		lines := strings.Split(s, "\n")
		slices.Sort(lines)
		return strings.Join(lines, "\n")
	}
	if sorted(got) != sorted(want) {
		t.Fatalf("%s: the table differs from a render from scratch:\n%s", what, lineDiff(want, got))
	}
}

// TestGolden: the table the scenario renders, as nft would load it.
func TestGolden(t *testing.T) {
	svcs, sl := goldenScenario()
	got := dump(t, build(t, svcs, sl))
	path := filepath.Join("testdata", "scenario.golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Fatalf("rendered table differs from %s (run with -update to accept):\n%s", path, lineDiff(string(want), got))
	}
}

// lineDiff lists the lines only in want (-) and only in got (+).
func lineDiff(want, got string) string {
	count := func(s string) map[string]int {
		m := map[string]int{}
		for _, l := range strings.Split(s, "\n") {
			m[l]++
		}
		return m
	}
	w, g := count(want), count(got)
	var b strings.Builder
	for _, l := range strings.Split(want, "\n") {
		if w[l] > g[l] {
			fmt.Fprintf(&b, "- %s\n", l)
		}
	}
	for _, l := range strings.Split(got, "\n") {
		if g[l] > w[l] {
			fmt.Fprintf(&b, "+ %s\n", l)
		}
	}
	return b.String()
}

// scripted drives the real tracker through a series of changes; after each
// step, check gets the tracker's state.
type scripted struct {
	t      *testing.T
	tr     *model.Tracker
	svcs   []*corev1.Service
	slices []*discoveryv1.EndpointSlice
}

func newScripted(t *testing.T) *scripted {
	s := &scripted{t: t, tr: model.NewTracker()}
	s.svcs, s.slices = goldenScenario()
	for _, svc := range s.svcs {
		s.tr.OnService(nil, svc)
	}
	for _, es := range s.slices {
		s.tr.OnEndpointSlice(nil, es)
	}
	return s
}

func (s *scripted) state() model.State {
	st, errs := s.tr.Snapshot()
	if len(errs) > 0 {
		s.t.Fatal(errs)
	}
	return st
}

func (s *scripted) setSlice(svc string, es *discoveryv1.EndpointSlice) {
	for i, old := range s.slices {
		if old.Labels[discoveryv1.LabelServiceName] == svc && (es == nil || old.Name == es.Name) {
			s.tr.OnEndpointSlice(old, es)
			if es == nil {
				s.slices = append(s.slices[:i], s.slices[i+1:]...)
			} else {
				s.slices[i] = es
			}
			return
		}
	}
	s.tr.OnEndpointSlice(nil, es)
	s.slices = append(s.slices, es)
}

func (s *scripted) setService(old, svc *corev1.Service) { s.tr.OnService(old, svc) }

// steps are the changes the incremental tests go through: the common ones
// (endpoints added, removed, changed; a Service added, removed) and those
// that move a frontend between owners or maps.
func steps(s *scripted) []struct {
	name   string
	common bool
	do     func()
} {
	ep := func(ip string) proxytest.Endpoint { return proxytest.Endpoint{IP: ip, Node: proxytest.NodeName} }
	extra := proxytest.Service("added", "10.96.3.1", nil)
	np := s.svcs[1]
	moved := np.DeepCopy()
	moved.Spec.Ports[0].NodePort = 31999
	clash := proxytest.Service("clash", "10.96.3.2", func(svc *corev1.Service) { svc.Spec.ExternalIPs = []string{"10.96.0.10"} })
	return []struct {
		name   string
		common bool
		do     func()
	}{
		{"an endpoint added", true, func() {
			s.setSlice("web", proxytest.Slice("web", ep(proxytest.PodA), ep(proxytest.PodB), ep(proxytest.PodC), ep("10.244.1.9")))
		}},
		{"an endpoint removed", true, func() { s.setSlice("web", proxytest.Slice("web", ep(proxytest.PodA), ep(proxytest.PodC))) }},
		{"an endpoint changed", true, func() {
			es := proxytest.Slice("web", ep(proxytest.PodA), ep(proxytest.PodC))
			f := false
			es.Endpoints[1].Conditions.Ready = &f
			s.setSlice("web", es)
		}},
		{"an affinity endpoint removed", true, func() { s.setSlice("sticky", proxytest.Slice("sticky", ep(proxytest.PodA))) }},
		{"a service added", true, func() { s.setService(nil, extra) }},
		{"its endpoints added", true, func() { s.setSlice("added", proxytest.Slice("added", ep(proxytest.PodA))) }},
		{"a service removed", true, func() { s.setService(extra, nil); s.setSlice("added", nil) }},
		{"all endpoints removed", true, func() { s.setSlice("web", nil) }},
		{"a NodePort moved", false, func() { s.setService(np, moved) }},
		{"a second claim on a ClusterIP", false, func() { s.setService(nil, clash) }},
		{"the big service shrinks to preset size", false, func() { s.setSlice("big", proxytest.Slice("big", ep("10.244.2.10"))) }},
		{"the claim withdrawn", false, func() { s.setService(clash, nil) }},
	}
}

// TestIncrementalMatchesScratch: after each change delivered by the real
// tracker, the table a backend updated by partial syncs holds exactly what
// a render from scratch gives.
func TestIncrementalMatchesScratch(t *testing.T) {
	s := newScripted(t)
	fake := knftables.NewFake(knftables.InetFamily, nftables.TableName)
	b := nftables.NewWith(nodeConfig(), fake)
	if err := b.Sync(s.state(), false); err != nil {
		t.Fatal(err)
	}
	for _, step := range steps(s) {
		step.do()
		st := s.state()
		if err := b.Sync(st, false); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if b.LastStats.Full {
			t.Fatalf("%s: a full sync, want a partial one", step.name)
		}
		sameTable(t, step.name, dump(t, st), fake.Dump())
	}
}

// TestCommonChangesAreElementWrites: the common changes write elements
// only: no rule, chain, set or map is added or deleted (each would make
// the kernel validate the table; see doc.go).
func TestCommonChangesAreElementWrites(t *testing.T) {
	s := newScripted(t)
	fake := knftables.NewFake(knftables.InetFamily, nftables.TableName)
	b := nftables.NewWith(nodeConfig(), fake)
	if err := b.Sync(s.state(), false); err != nil {
		t.Fatal(err)
	}
	for _, step := range steps(s) {
		step.do()
		if err := b.Sync(s.state(), false); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		st := b.LastStats
		if !step.common {
			continue
		}
		if st.Rules != 0 || st.Objects != 0 {
			t.Errorf("%s: %+v, want element writes only", step.name, st)
		}
		if n := st.ElementAdds + st.ElementDeletes; n == 0 || n > 40 {
			t.Errorf("%s: %d element writes, want a handful", step.name, n)
		}
		for _, line := range strings.Split(fake.LastTransaction.String(), "\n") {
			if line != "" && !strings.Contains(line, " element ") {
				t.Errorf("%s: the transaction has %q", step.name, line)
			}
		}
	}
}

// failing fails the next Run, then behaves as its fake.
type failing struct {
	*knftables.Fake
	fail bool
}

func (f *failing) Run(ctx context.Context, tx *knftables.Transaction) error {
	if f.fail {
		f.fail = false
		return errors.New("injected failure")
	}
	return f.Fake.Run(ctx, tx)
}

// TestFailedSyncIsFollowedByAFullOne: a failed transaction changes
// nothing, and the next sync is full and leaves the table right.
func TestFailedSyncIsFollowedByAFullOne(t *testing.T) {
	s := newScripted(t)
	f := &failing{Fake: knftables.NewFake(knftables.InetFamily, nftables.TableName)}
	b := nftables.NewWith(nodeConfig(), f)
	if err := b.Sync(s.state(), false); err != nil {
		t.Fatal(err)
	}
	before := f.Dump()
	s.setSlice("web", nil)
	f.fail = true
	if err := b.Sync(s.state(), false); err == nil {
		t.Fatal("the injected failure was not reported")
	}
	if f.Dump() != before {
		t.Fatal("a failed transaction changed the table")
	}
	if err := b.Sync(s.state(), false); err != nil {
		t.Fatal(err)
	}
	if !b.LastStats.Full {
		t.Fatalf("the sync after a failure was partial: %+v", b.LastStats)
	}
	sameTable(t, "after recovery", dump(t, s.state()), f.Dump())
}

// TestMissingNFT: without the nft tool the backend fails at start, saying
// what it needs.
func TestMissingNFT(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := nftables.New(nodeConfig())
	if err == nil || !strings.Contains(err.Error(), "needs the nft tool") {
		t.Fatalf("got %v, want an error naming nft", err)
	}
}

// TestUpdateSeesEveryChange: the renderer finds unchanged ports by the
// identity of their ServicePort and endpoint list; a State whose maps keep
// a port's ServicePort but drop or replace its endpoint list (as any
// producer of States may) is rendered as from scratch.
func TestUpdateSeesEveryChange(t *testing.T) {
	svcs, sl := goldenScenario()
	st := build(t, svcs, sl)
	fake := knftables.NewFake(knftables.InetFamily, nftables.TableName)
	b := nftables.NewWith(nodeConfig(), fake)
	if err := b.Sync(st, false); err != nil {
		t.Fatal(err)
	}
	var web model.ServicePortName
	for n := range st.Ports {
		if n.Name == "web" && len(st.Endpoints[n]) > 1 {
			web = n
		}
	}
	if web.Name == "" {
		t.Fatal("the scenario has no web port with endpoints")
	}
	next := func(what string, edit func(eps map[model.ServicePortName][]model.Endpoint)) {
		t.Helper()
		st = model.State{Ports: maps.Clone(st.Ports), Endpoints: maps.Clone(st.Endpoints)}
		edit(st.Endpoints)
		if err := b.Sync(st, false); err != nil {
			t.Fatal(err)
		}
		sameTable(t, what, dump(t, st), fake.Dump())
	}
	old := st.Endpoints[web]
	next("the endpoint list replaced by a shorter one", func(eps map[model.ServicePortName][]model.Endpoint) { eps[web] = slices.Clone(old[1:]) })
	next("the endpoint list cut to a prefix of itself", func(eps map[model.ServicePortName][]model.Endpoint) { eps[web] = eps[web][:1] })
	next("the endpoint list dropped", func(eps map[model.ServicePortName][]model.Endpoint) { delete(eps, web) })
	next("the endpoint list back", func(eps map[model.ServicePortName][]model.Endpoint) { eps[web] = old })
}
