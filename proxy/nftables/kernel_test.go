package nftables_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/knftables"

	"github.com/weftnet/weft/proxy/nftables"
	"github.com/weftnet/weft/proxy/proxytest"
)

func nft(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("nft", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("nft %v: %v: %s", args, err, out)
	}
	return string(out)
}

// TestEndpointChangeInTheKernel: an endpoint change is a partial sync of
// element writes only, and traffic follows it at once.
func TestEndpointChangeInTheKernel(t *testing.T) {
	n, b := newNode(t, "a", "b")
	n.Svcs = []*corev1.Service{proxytest.Service("web", "10.96.0.10", nil)}
	n.Slices = []*discoveryv1.EndpointSlice{proxytest.Slice("web", n.Local("a"))}
	n.Sync()
	if !b.LastStats.Full {
		t.Fatalf("first sync: %+v, want full", b.LastStats)
	}
	n.Slices = []*discoveryv1.EndpointSlice{proxytest.Slice("web", n.Local("b"))}
	n.Sync()
	if st := b.LastStats; st.Full || st.Rules != 0 || st.Objects != 0 || st.ElementAdds == 0 {
		t.Fatalf("endpoint change: %+v, want a partial sync of element writes", st)
	}
	for range 5 {
		if r, err := proxytest.Get(n.Pods["a"].NS, "", "http://10.96.0.10/"); err != nil || r.Pod != "b" {
			t.Fatalf("after the change: %+v %v, want b", r, err)
		}
	}
}

// TestAffinitySurvivesRestart: a restarted proxy's full sync rewrites the
// table in place and keeps the ClientIP affinity entries, so a client
// stays on its endpoint.
func TestAffinitySurvivesRestart(t *testing.T) {
	n, _ := newNode(t, "a", "b", "c")
	n.Svcs = []*corev1.Service{proxytest.Service("sticky", "10.96.0.15", func(s *corev1.Service) {
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	})}
	n.Slices = []*discoveryv1.EndpointSlice{proxytest.Slice("sticky", n.Local("a"), n.Local("b"), n.Local("c"))}
	n.Sync()
	r, err := proxytest.Get(n.Pods["b"].NS, "", "http://10.96.0.15/")
	if err != nil {
		t.Fatal(err)
	}
	first := r.Pod
	n.Backend = n.NewBackend()
	n.Sync()
	if st := n.Backend.(*nftables.Backend).LastStats; !st.Full || st.Recreated || st.Rules != 0 || st.AffinityPurged != 0 {
		t.Fatalf("restart sync: %+v, want a full sync in place that writes no rule and purges nothing", st)
	}
	for i := range 10 {
		if r, err := proxytest.Get(n.Pods["b"].NS, "", "http://10.96.0.15/"); err != nil || r.Pod != first {
			t.Fatalf("request %d after the restart: %+v %v, want %s", i, r, err, first)
		}
	}
}

// TestCleanupTouchesNoOtherTable: syncs and --cleanup leave other tables
// (a firewall's, say) alone, and cleanup leaves nothing of weft's.
func TestCleanupTouchesNoOtherTable(t *testing.T) {
	n, b := newNode(t, "a")
	nft(t, "add", "table", "inet", "firewall")
	t.Cleanup(func() { _ = exec.Command("nft", "delete", "table", "inet", "firewall").Run() })
	nft(t, "add", "chain", "inet", "firewall", "input", "{ type filter hook input priority 0 ; }")
	nft(t, "add", "rule", "inet", "firewall", "input", "ip saddr 198.51.100.2 drop")
	n.Svcs = []*corev1.Service{proxytest.Service("web", "10.96.0.10", nil)}
	n.Slices = []*discoveryv1.EndpointSlice{proxytest.Slice("web", n.Local("a"))}
	n.Sync()
	if err := b.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if err := b.Cleanup(); err != nil {
		t.Fatalf("a second cleanup: %v", err)
	}
	out := nft(t, "list", "ruleset")
	if !strings.Contains(out, "ip saddr 198.51.100.2 drop") {
		t.Errorf("the firewall's rule is gone:\n%s", out)
	}
	if strings.Contains(out, "table inet "+nftables.TableName+" ") {
		t.Errorf("weft's table left after cleanup:\n%s", out)
	}
}

// TestNewCountAndTimeoutInTheKernel: a Service with more endpoints than
// the preset maps, or a new affinity timeout, brings its maps and rules in
// a partial sync, and takes them away again, without disturbing the rest.
func TestNewCountAndTimeoutInTheKernel(t *testing.T) {
	n, b := newNode(t, "a")
	var many []proxytest.Endpoint
	for i := range 20 {
		many = append(many, proxytest.Endpoint{IP: fmt.Sprintf("10.244.2.%d", 10+i), Node: proxytest.OtherNode})
	}
	n.Svcs = []*corev1.Service{proxytest.Service("web", "10.96.0.10", nil)}
	n.Slices = []*discoveryv1.EndpointSlice{proxytest.Slice("web", n.Local("a"))}
	n.Sync()
	n.Svcs = append(n.Svcs, proxytest.Service("big", "10.96.0.11", nil), proxytest.Service("short", "10.96.0.12", func(s *corev1.Service) {
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		sec := int32(30)
		s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &sec}}
	}))
	n.Slices = append(n.Slices, proxytest.Slice("big", many...), proxytest.Slice("short", n.Local("a")))
	n.Sync()
	if st := b.LastStats; st.Full || st.Rules == 0 || st.Objects == 0 {
		t.Fatalf("adding a 20-endpoint Service and a 30 s affinity: %+v, want a partial sync adding maps and rules", st)
	}
	out := nft(t, "list", "chain", "inet", nftables.TableName, "lb4")
	if !strings.Contains(out, "numgen random mod 20 map @lb4-20") {
		t.Fatalf("no rule for 20 endpoints:\n%s", out)
	}
	for _, url := range []string{"http://10.96.0.10/", "http://10.96.0.12/"} {
		if r, err := proxytest.Get(n.Pods["a"].NS, "", url); err != nil || r.Pod != "a" {
			t.Fatalf("%s: %+v %v", url, r, err)
		}
	}
	n.Svcs, n.Slices = n.Svcs[:1], n.Slices[:1]
	n.Sync()
	if st := b.LastStats; st.Full || st.Rules == 0 || st.Objects == 0 {
		t.Fatalf("removing them: %+v, want a partial sync deleting maps and rules", st)
	}
	if out := nft(t, "list", "table", "inet", nftables.TableName); strings.Contains(out, "lb4-20") || strings.Contains(out, "clients4-30") {
		t.Fatalf("the 20-endpoint or 30 s objects are left:\n%s", out)
	}
	if r, err := proxytest.Get(n.Pods["a"].NS, "", "http://10.96.0.10/"); err != nil || r.Pod != "a" {
		t.Fatalf("web after the removal: %+v %v", r, err)
	}
}

// kernelElements lists the elements of every plain set and map of the
// table in the kernel ("key : value", sorted), in one nft --json listing.
// The interval set and the dynamic client maps are left out (nft writes the
// former; the packet path the latter).
func kernelElements(t *testing.T) map[string][]string {
	t.Helper()
	var doc struct {
		Nftables []map[string]struct {
			Name string            `json:"name"`
			Elem []json.RawMessage `json:"elem"`
		} `json:"nftables"`
	}
	out, err := exec.Command("nft", "--json", "list", "table", "inet", nftables.TableName).Output() // stderr: nft's warnings
	if err != nil {
		t.Fatalf("listing the table: %v", err)
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatal(err)
	}
	// part is one key or value: a concatenation, or a lone value.
	part := func(raw json.RawMessage) string {
		var c struct {
			Concat []json.RawMessage `json:"concat"`
		}
		if json.Unmarshal(raw, &c) == nil && c.Concat != nil {
			var ps []string
			for _, p := range c.Concat {
				ps = append(ps, strings.Trim(string(p), `"`))
			}
			return strings.Join(ps, " . ")
		}
		return strings.Trim(string(raw), `"`)
	}
	elems := map[string][]string{}
	for _, o := range doc.Nftables {
		for kind, obj := range o {
			if (kind != "set" && kind != "map") || strings.HasPrefix(obj.Name, "firewall-allow") || strings.HasPrefix(obj.Name, "clients") {
				continue
			}
			list := []string{}
			for _, e := range obj.Elem {
				var kv []json.RawMessage
				if kind == "map" && json.Unmarshal(e, &kv) == nil && len(kv) == 2 {
					list = append(list, part(kv[0])+" : "+part(kv[1]))
				} else {
					list = append(list, part(e)+" : ")
				}
			}
			slices.Sort(list)
			elems[obj.Name] = list
		}
	}
	return elems
}

// fakeElements is kernelElements for knftables' fake.
func fakeElements(t *testing.T, fake *knftables.Fake) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, kind := range []string{"set", "map"} {
		names, err := fake.List(context.Background(), kind)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			if strings.HasPrefix(n, "firewall-allow") || strings.HasPrefix(n, "clients") {
				continue
			}
			els, err := fake.ListElements(context.Background(), kind, n)
			if err != nil {
				t.Fatal(err)
			}
			list := []string{}
			for _, e := range els {
				list = append(list, strings.Join(e.Key, " . ")+" : "+strings.Join(e.Value, " . "))
			}
			slices.Sort(list)
			out[n] = list
		}
	}
	return out
}

// TestKernelElementsMatchTheRender: the elements the backend writes to the
// kernel (over nfnetlink, not through nft) read back through nft as
// exactly what knftables' fake holds for the same syncs: the first, and
// the partial one after each change of the incremental tests (new and
// removed endpoint counts and timeouts among them).
func TestKernelElementsMatchTheRender(t *testing.T) {
	s := newScripted(t)
	fake := knftables.NewFake(knftables.InetFamily, nftables.TableName)
	ref := nftables.NewWith(nodeConfig(), fake)
	b, err := nftables.New(nodeConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Cleanup() })
	check := func(step string) {
		t.Helper()
		st := s.state()
		if err := ref.Sync(st, false); err != nil {
			t.Fatal(err)
		}
		if err := b.Sync(st, false); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		want, got := fakeElements(t, fake), kernelElements(t)
		for n := range want {
			if !slices.Equal(want[n], got[n]) {
				t.Errorf("%s: set %s in the kernel:\n%s\nwant:\n%s", step, n, strings.Join(got[n], "\n"), strings.Join(want[n], "\n"))
			}
		}
		for n := range got {
			if _, ok := want[n]; !ok {
				t.Errorf("%s: the kernel has set %s, the render does not", step, n)
			}
		}
	}
	check("first sync")
	for _, step := range steps(s) {
		step.do()
		check(step.name)
	}
}

// TestLoadBalancingMapSizeClasses: a load-balancing map past 8,192
// elements is declared with a size, and given a larger one (a new map,
// filled before the old one goes) when it outgrows it, in partial syncs
// whose traffic never stops; a restarted proxy keeps the map whose class
// still fits; a map that shrinks goes back to a plain one; a restarted
// proxy that needs another class patches the chain as a partial sync does.
func TestLoadBalancingMapSizeClasses(t *testing.T) {
	pods := []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"}
	n, b := newNode(t, pods...)
	var local []proxytest.Endpoint
	for _, p := range pods {
		local = append(local, n.Local(p))
	}
	web := proxytest.Service("web", "10.96.100.10", nil) // apart from the bulk's 10.96.0-3.x
	webSlice := proxytest.Slice("web", local...)
	// bulk Services of 2 ports x 10 endpoints: 20 elements each in lb4-10.
	svcs, bulkSlices := proxytest.BenchObjects(900)
	load := func(bulk int) {
		n.Svcs = append([]*corev1.Service{web}, svcs[:bulk]...)
		n.Slices = append([]*discoveryv1.EndpointSlice{webSlice}, bulkSlices[:bulk]...)
		n.Sync()
	}
	maps := func() []string {
		t.Helper()
		var doc struct {
			Nftables []map[string]struct {
				Name string `json:"name"`
				Size int    `json:"size"`
			} `json:"nftables"`
		}
		out, err := exec.Command("nft", "--json", "list", "maps", "inet").Output()
		if err != nil {
			t.Fatalf("listing the maps: %v", err)
		}
		if err := json.Unmarshal(out, &doc); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, o := range doc.Nftables {
			if m, ok := o["map"]; ok && strings.HasPrefix(m.Name, "lb4-10") {
				names = append(names, fmt.Sprintf("%s/%d", m.Name, m.Size))
			}
		}
		return names
	}
	expect := func(step string, want string) {
		t.Helper()
		if got := maps(); !slices.Equal(got, []string{want}) {
			t.Fatalf("%s: the kernel's lb4-10 maps are %v, want %s", step, got, want)
		}
		els := kernelElements(t)[strings.Split(want, "/")[0]]
		// the bulk's and web's 10 elements, at least: what the render
		// holds is checked element by element by TestKernelElementsMatchTheRender.
		if len(els) < 10 {
			t.Fatalf("%s: %s holds %d elements", step, want, len(els))
		}
		seen := map[string]bool{}
		for range 40 {
			r, err := proxytest.Get(n.Pods["a"].NS, "", "http://10.96.100.10/")
			if err != nil {
				t.Fatalf("%s: web: %v", step, err)
			}
			seen[r.Pod] = true
		}
		if len(seen) < 2 {
			t.Fatalf("%s: web answered only from %v", step, seen)
		}
	}

	load(500) // 10,010 elements: a size of 2^14
	expect("first sync", "lb4-10-s14/16384")
	load(900) // 18,010: past 2^14, grown to 2^15
	if st := b.LastStats; st.Full || st.Objects == 0 {
		t.Fatalf("growing: %+v, want a partial sync with a new map", st)
	}
	expect("grown", "lb4-10-s15/32768")
	load(300) // 6,010: under 8,192 but more than an eighth: kept
	if st := b.LastStats; st.Full || st.Objects != 0 || st.Rules != 0 {
		t.Fatalf("shrinking a little: %+v, want element writes only", st)
	}
	expect("kept", "lb4-10-s15/32768")

	// A restart: a fresh renderer alone would give 6,010 elements a plain
	// map; the new backend adopts the kernel's class instead.
	n.Backend = n.NewBackend()
	b = n.Backend.(*nftables.Backend)
	load(300)
	if st := b.LastStats; !st.Full || st.Rules != 0 || st.Objects != 0 {
		t.Fatalf("restart: %+v, want a full sync keeping every chain and map", st)
	}
	expect("restarted", "lb4-10-s15/32768")

	load(100) // 2,010: under an eighth, back to a plain map
	expect("shrunk", "lb4-10/0")

	// A restart into a state that needs another class: the full sync
	// appends the new map's rule and deletes the old one after the
	// elements, as a partial sync does, instead of rewriting the chain
	// (which would leave the frontends without a map until the batch).
	n.Backend = n.NewBackend()
	b = n.Backend.(*nftables.Backend)
	load(500)
	if st := b.LastStats; !st.Full || st.Recreated || st.Rules != 2 {
		t.Fatalf("restart into a new class: %+v, want a full sync adding one rule and deleting one", st)
	}
	expect("restarted, grown", "lb4-10-s14/16384")
}
