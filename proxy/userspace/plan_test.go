package userspace_test

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/weftnet/weft/proxy/model"
	"github.com/weftnet/weft/proxy/proxytest"
	"github.com/weftnet/weft/proxy/userspace"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// scenarioPlan is the plan of the shared scenario on the scenario's node.
func scenarioPlan(t *testing.T, rootless bool) []userspace.Listener {
	t.Helper()
	svcs, sl := proxytest.Scenario()
	st, errs := model.Build(svcs, sl)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	return userspace.Plan(userspace.PlanConfig{NodeName: proxytest.NodeName, Rootless: rootless,
		NodePortIPs: []netip.Addr{netip.MustParseAddr(proxytest.NodeIP)}}, st)
}

func find(t *testing.T, ls []userspace.Listener, svc, port string, scope userspace.Scope) userspace.Listener {
	t.Helper()
	for _, l := range ls {
		if l.Key.Port.Name == svc && l.Key.Port.Port == port && l.Key.Scope == scope {
			return l
		}
	}
	t.Fatalf("no %s listener for %s:%s", scope, svc, port)
	return userspace.Listener{}
}

func aps(ss ...string) []netip.AddrPort {
	var out []netip.AddrPort
	for _, s := range ss {
		out = append(out, netip.MustParseAddrPort(s))
	}
	return out
}

// TestPlan: the listeners of the shared scenario, their endpoints per
// scope and traffic policy, and their frontends.
func TestPlan(t *testing.T) {
	ls := scenarioPlan(t, false)
	web := find(t, ls, "web", "http", userspace.Internal)
	if got := web.ByFamily[0].Serve; !slices.Equal(got, aps(proxytest.PodA+":80", proxytest.PodB+":80", proxytest.PodC+":80")) {
		t.Errorf("web: %v", got)
	}
	if len(web.Frontends) != 1 || web.Frontends[0].String() != "10.96.0.10:80/TCP" {
		t.Errorf("web frontends %v", web.Frontends)
	}
	np := find(t, ls, "np", "http", userspace.External)
	if len(np.Frontends) != 1 || np.Frontends[0].String() != proxytest.NodeIP+":30080/TCP" {
		t.Errorf("np frontends %v", np.Frontends)
	}
	// externalTrafficPolicy Local: outside clients get the local endpoint,
	// pods and the node the cluster-wide list.
	local := find(t, ls, "local", "http", userspace.External)
	if e := local.ByFamily[0]; !slices.Equal(e.Serve, aps(proxytest.PodC+":80")) ||
		!slices.Equal(e.Cluster, aps(proxytest.PodC+":80", proxytest.RemoteEP+":80")) {
		t.Errorf("local: %+v", e)
	}
	if e := find(t, ls, "local", "http", userspace.Internal).ByFamily[0]; e.Cluster != nil || len(e.Serve) != 2 {
		t.Errorf("local's ClusterIP: %+v", e)
	}
	if e := find(t, ls, "itp-remote", "http", userspace.Internal).ByFamily[0]; !e.HasAny || len(e.Serve) != 0 {
		t.Errorf("itp-remote: %+v, want endpoints none of which is usable here", e)
	}
	if e := find(t, ls, "empty", "http", userspace.Internal).ByFamily[0]; e.HasAny {
		t.Errorf("empty: %+v", e)
	}
	lb := find(t, ls, "lb", "http", userspace.External)
	if got := fmt.Sprint(lb.Frontends); got != "["+proxytest.NodeIP+":30083/TCP 192.0.2.10:80/TCP]" ||
		!slices.Equal(lb.Frontends[1].SourceRanges, []netip.Prefix{netip.MustParsePrefix(proxytest.ExtIP + "/32")}) {
		t.Errorf("lb frontends %v", lb.Frontends)
	}
	if s := find(t, ls, "sticky", "http", userspace.Internal); s.Affinity.Seconds() != model.DefaultAffinitySeconds {
		t.Errorf("sticky affinity %v", s.Affinity)
	}
	if d := find(t, ls, "dns", "dns", userspace.Internal); d.Protocol != model.UDP || d.ServicePort != 81 {
		t.Errorf("dns %+v", d)
	}
	for i := 1; i < len(ls); i++ {
		if ls[i-1].Key.String() >= ls[i].Key.String() && ls[i-1].Key.Port == ls[i].Key.Port {
			t.Errorf("not ordered: %s, %s", ls[i-1].Key, ls[i].Key)
		}
	}

	// Rootless: ClusterIP listeners only, without frontends.
	for _, l := range scenarioPlan(t, true) {
		if l.Key.Scope != userspace.Internal || len(l.Frontends) > 0 || l.Family != 4 {
			t.Errorf("rootless listener %s: scope %s, frontends %v, family %d", l.Key, l.Key.Scope, l.Frontends, l.Family)
		}
	}
}

// TestGlue: the verdict of each frontend, rendered for iptables and for
// nftables, against golden files (-update rewrites them).
func TestGlue(t *testing.T) {
	ls := scenarioPlan(t, false)
	bound := map[userspace.Key]uint16{}
	for i, l := range ls {
		if l.Key.Port.Name != "extip" { // extip's listeners could not be bound
			bound[l.Key] = uint16(20000 + i)
		}
	}
	g := userspace.Glue(ls, bound)
	has := func(l []userspace.Frontend, s string) bool {
		return slices.ContainsFunc(l, func(f userspace.Frontend) bool { return f.String() == s })
	}
	for _, c := range []struct {
		what string
		ok   bool
	}{
		{"empty rejected", has(g.Reject, "10.96.0.16:80/TCP")},
		{"unbound extip rejected", has(g.Reject, proxytest.ExtIPv4+":80/TCP") && has(g.Reject, "10.96.0.19:80/TCP")},
		{"itp-remote dropped", has(g.Drop, "10.96.0.18:80/TCP")},
		{"remote-only dropped for outside clients only", has(g.DropExternal, proxytest.NodeIP+":30082/TCP") && !has(g.Drop, proxytest.NodeIP+":30082/TCP")},
		{"lb firewalled", has(g.Firewall, "192.0.2.10:80/TCP")},
		{"web redirected", slices.ContainsFunc(g.Redirect, func(r userspace.Redirect) bool { return r.String() == "10.96.0.10:80/TCP" && r.To != 0 })},
	} {
		if !c.ok {
			t.Errorf("%s: %+v", c.what, g)
		}
	}
	if !g.Equal(userspace.Glue(ls, bound)) {
		t.Error("the same input glues differently")
	}

	cidrs := []netip.Prefix{netip.MustParsePrefix(proxytest.Cluster), netip.MustParsePrefix(proxytest.Cluster6)}
	var ipt strings.Builder
	for _, fam := range []int{4, 6} {
		fmt.Fprintf(&ipt, "# IPv%d\n%s", fam, userspace.RenderIPTables(g, fam, cidrs, userspace.AllJumps()))
	}
	golden(t, "glue-iptables.golden", ipt.String())
	fake := knftables.NewFake(knftables.InetFamily, userspace.TableName)
	tx := fake.NewTransaction()
	userspace.RenderNFT(tx, g, cidrs)
	if err := fake.Run(t.Context(), tx); err != nil {
		t.Fatal(err)
	}
	golden(t, "glue-nftables.golden", fake.Dump())
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != got {
		t.Errorf("%s differs (go test -update rewrites it); got:\n%s", path, got)
	}
}

// TestCandidates: the service's own port first in rootless mode, then
// ports of the range from a start derived from the key: the same for the
// same key, inside the range, each once.
func TestCandidates(t *testing.T) {
	k := userspace.Key{Port: model.ServicePortName{Namespace: "default", Name: "web", Port: "http", Protocol: model.TCP}, Scope: userspace.Internal}
	r := userspace.PortRange{First: 20000, Last: 20009}
	c := userspace.Candidates(k, 8080, true, r)
	if c[0] != 8080 || len(c) != 11 {
		t.Fatalf("%v: want 8080 then the 10 ports of the range", c)
	}
	seen := map[uint16]bool{}
	for _, p := range c[1:] {
		if p < r.First || p > r.Last || seen[p] {
			t.Fatalf("%v: %d out of range or repeated", c, p)
		}
		seen[p] = true
	}
	if again := userspace.Candidates(k, 8080, true, r); !slices.Equal(c, again) {
		t.Fatalf("not stable: %v then %v", c, again)
	}
	if own := userspace.Candidates(k, 20003, true, r); own[0] != 20003 || slices.Contains(own[1:], 20003) || len(own) != 10 {
		t.Fatalf("own port inside the range: %v", own)
	}
	if redirect := userspace.Candidates(k, 8080, false, r); slices.Contains(redirect, 8080) || !slices.Equal(redirect, c[1:]) {
		t.Fatalf("redirect mode: %v", redirect)
	}
	other := k
	other.Scope = userspace.External
	if userspace.Candidates(other, 0, false, userspace.DefaultPortRange)[0] == userspace.Candidates(k, 0, false, userspace.DefaultPortRange)[0] {
		t.Log("two keys start at the same port (possible, unlikely)")
	}
	if big := userspace.Candidates(k, 0, false, userspace.DefaultPortRange); len(big) != 64 {
		t.Fatalf("%d probes of a large range, want 64", len(big))
	}
}

func TestParsePortRange(t *testing.T) {
	if r, err := userspace.ParsePortRange("20000-20010"); err != nil || r != (userspace.PortRange{First: 20000, Last: 20010}) {
		t.Fatalf("%v %v", r, err)
	}
	for _, bad := range []string{"", "20000", "0-10", "10-5", "1-70000", "a-b", "1-2x"} {
		if _, err := userspace.ParsePortRange(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestDump: --dry-run prints the listeners and, in redirect mode, the glue,
// touching nothing.
func TestDump(t *testing.T) {
	svcs, sl := proxytest.Scenario()
	st, _ := model.Build(svcs, sl)
	rootless, err := userspace.New(userspace.Config{Listen: netip.MustParseAddr("127.0.0.1"), NodeName: proxytest.NodeName})
	if err != nil {
		t.Fatal(err)
	}
	out, err := rootless.Dump(st)
	if err != nil || !strings.Contains(out, "default/web:http/TCP internal 127.0.0.1:80 -> [10.244.1.2:80 10.244.1.3:80 10.244.1.4:80]") ||
		strings.Contains(out, "glue") {
		t.Fatalf("rootless dump (%v):\n%s", err, out)
	}
	redirect, err := userspace.New(userspace.Config{Glue: "iptables", NodeName: proxytest.NodeName,
		NodePortIPs: []netip.Addr{netip.MustParseAddr(proxytest.NodeIP)}})
	if err != nil {
		t.Fatal(err)
	}
	if out, err = redirect.Dump(st); err != nil || !strings.Contains(out, "-A WEFT-USERSPACE -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j REDIRECT") {
		t.Fatalf("redirect dump (%v):\n%s", err, out)
	}
	if len(rootless.Services()) != 0 || len(redirect.Services()) != 0 {
		t.Fatal("Dump bound listeners")
	}
}
