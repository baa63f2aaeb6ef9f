package ebpf_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/internal/testutil"
	"github.com/weftnet/weft/proxy"
	weftebpf "github.com/weftnet/weft/proxy/ebpf"
	"github.com/weftnet/weft/proxy/proxytest"
)

// TestMapWrites: the first sync writes every frontend; one endpoint change
// rewrites only that Service's frontends and adds only its new backends;
// removing Services deletes their frontends and orphan backends, leaving
// the maps holding exactly the remaining Service.
func TestMapWrites(t *testing.T) {
	n := proxytest.NewNode(t, backend, "a", "b")
	for i := range 20 {
		n.Svcs = append(n.Svcs, proxytest.Service(fmt.Sprintf("s%d", i), fmt.Sprintf("10.96.1.%d", i+1), nil))
		n.Slices = append(n.Slices, proxytest.Slice(fmt.Sprintf("s%d", i), n.Local("a")))
	}
	settle := func() {
		if err := n.Backend.(*weftebpf.Backend).Settle(); err != nil {
			t.Fatal(err)
		}
	}
	stats := func() weftebpf.Stats { n.Sync(); settle(); return n.Backend.(*weftebpf.Backend).LastStats() }
	if st := stats(); st.Frontends != 40 || st.BackendsAdded != 2 {
		t.Fatalf("first sync: %+v, want 40 frontends (20 services x 2 ports) and a's 2 backends", st)
	}
	n.Slices[3] = proxytest.Slice("s3", n.Local("a"), n.Local("b"))
	if st := stats(); st.Frontends != 2 || st.UnchangedSkipped != 38 || st.BackendsAdded != 2 || st.SlotsWritten != 4 {
		t.Fatalf("one endpoint added: %+v, want s3's 2 frontends rewritten with 4 slots, b's 2 backends added", st)
	}
	if r, err := proxytest.Get(n.Pods["a"].NS, "", "http://10.96.1.4/"); err != nil || (r.Pod != "a" && r.Pod != "b") {
		t.Fatalf("s3 after the change: %+v %v", r, err)
	}
	n.Svcs, n.Slices = n.Svcs[:1], n.Slices[:1]
	if st := stats(); st.Removed != 38 || st.BackendsRemoved != 2 || st.Frontends != 0 {
		t.Fatalf("19 services removed: %+v, want 38 frontends and b's 2 backends removed", st)
	}
	pin := envs[t].pin
	if got := entries(t, filepath.Join(pin, "weft_services")); got != 4 {
		t.Errorf("services map holds %d entries, want 4 (2 master entries, 2 slots)", got)
	}
	if got := entries(t, filepath.Join(pin, "weft_backends")); got != 2 {
		t.Errorf("backends map holds %d entries, want a's 2", got)
	}
	// A Service losing its endpoints keeps its frontends, now refusing.
	n.Slices = nil
	n.Sync()
	settle()
	if _, err := proxytest.Get(n.Pods["a"].NS, "", "http://10.96.1.1/"); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("s0 without endpoints: %v, want connection refused", err)
	}
	if got := entries(t, filepath.Join(pin, "weft_backends")); got != 0 {
		t.Errorf("backends map holds %d entries, want none", got)
	}
}

// pinnedMap opens the map pinned at path for the rest of the test.
func pinnedMap(t *testing.T, path string) *ebpf.Map {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func entries(t *testing.T, path string) int {
	t.Helper()
	m := pinnedMap(t, path)
	n := 0
	it := m.Iterate()
	var k, v []byte
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestForeignProgramsSurviveCleanup: programs and pins weft did not make
// (on the cgroup and on the uplink) stay through syncs and cleanup;
// cleanup removes every program, link and map weft made, on the cgroup
// and on the devices.
func TestForeignProgramsSurviveCleanup(t *testing.T) {
	n := proxytest.NewNode(t, backend, "a")
	e := envs[t]
	// A foreign connect4 program (allow everything) on the same cgroup,
	// and a foreign pin next to weft's directory.
	foreign, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.CGroupSockAddr, AttachType: ebpf.AttachCGroupInet4Connect,
		License: "MIT", Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	defer foreign.Close()
	fl, err := link.AttachCgroup(link.CgroupOptions{Path: e.cgroup, Attach: ebpf.AttachCGroupInet4Connect, Program: foreign})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	// A foreign tc program on the uplink's ingress, beside weft's.
	foreignTC := passTC(t, "")
	up, err := net.InterfaceByName(proxytest.Uplink)
	if err != nil {
		t.Fatal(err)
	}
	ftl, err := link.AttachTCX(link.TCXOptions{Interface: up.Index, Program: foreignTC, Attach: ebpf.AttachTCXIngress})
	if err != nil {
		t.Fatal(err)
	}
	defer ftl.Close()
	foreignPin := filepath.Join(filepath.Dir(e.pin), "foreign_prog")
	if err := foreign.Pin(foreignPin); err != nil {
		t.Fatal(err)
	}
	// A foreign masquerade rule in nat POSTROUTING.
	const foreignRule = "-s 10.99.0.0/16 -j MASQUERADE"
	if out, err := exec.Command("iptables", append([]string{"-w", "-t", "nat", "-A", "POSTROUTING"}, strings.Fields(foreignRule)...)...).CombinedOutput(); err != nil {
		t.Fatalf("adding a foreign rule: %v: %s", err, out)
	}
	n.Svcs = []*corev1.Service{proxytest.Service("web", "10.96.0.10", nil)}
	n.Slices = nil
	n.Sync()
	n.Slices = append(n.Slices, proxytest.Slice("web", n.Local("a")))
	n.Sync()
	if got := attached(t, e.cgroup, ebpf.AttachCGroupInet4Connect); got != 2 {
		t.Fatalf("%d connect4 programs on the cgroup, want the foreign one and weft's", got)
	}
	if got := tcxPrograms(t, proxytest.Uplink, false); len(got) != 2 {
		t.Fatalf("tcx programs on the uplink's ingress: %v, want the foreign one and weft's", got)
	}
	if got := tcxPrograms(t, proxytest.Uplink, true); len(got) != 1 {
		t.Fatalf("tcx programs on the uplink's egress: %v, want weft's", got)
	}
	if nat := natRules(t); !strings.Contains(nat, "-j WEFT-EBPF-POSTROUTING") || !strings.Contains(nat, foreignRule) {
		t.Fatalf("nat table after sync: want weft's masquerade glue beside the foreign rule:\n%s", nat)
	}
	if r, err := proxytest.Get("", "", "http://10.96.0.10/"); err != nil || r.Pod != "a" {
		t.Fatalf("service beside a foreign program: %+v %v", r, err)
	}
	if err := n.Backend.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if got := attached(t, e.cgroup, ebpf.AttachCGroupInet4Connect); got != 1 {
		t.Errorf("%d connect4 programs after cleanup, want only the foreign one", got)
	}
	if got := tcxPrograms(t, proxytest.Uplink, false); len(got) != 1 || got[0] != programID(t, foreignTC) {
		t.Errorf("tcx programs on the uplink's ingress after cleanup: %v, want only the foreign one", got)
	}
	if got := tcxPrograms(t, proxytest.Uplink, true); len(got) != 0 {
		t.Errorf("tcx programs on the uplink's egress after cleanup: %v, want none", got)
	}
	if nat := natRules(t); strings.Contains(nat, "WEFT-EBPF") || !strings.Contains(nat, foreignRule) {
		t.Errorf("nat table after cleanup: want the foreign rule and nothing of weft's:\n%s", nat)
	}
	for _, a := range []ebpf.AttachType{ebpf.AttachCGroupInet6Connect, ebpf.AttachCGroupUDP4Sendmsg, ebpf.AttachCGroupUDP6Recvmsg, ebpf.AttachCgroupInet4GetPeername} {
		if got := attached(t, e.cgroup, a); got != 0 {
			t.Errorf("%d programs of attach type %v after cleanup, want none", got, a)
		}
	}
	if _, err := os.Stat(e.pin); !os.IsNotExist(err) {
		t.Errorf("weft's pin directory after cleanup: %v", err)
	}
	if _, err := os.Stat(foreignPin); err != nil {
		t.Errorf("the foreign pin after cleanup: %v", err)
	}
	if _, err := proxytest.Get("", "", "http://10.96.0.10/"); err == nil {
		t.Error("the ClusterIP still answers after cleanup")
	}
	if r, err := proxytest.Get("", "", "http://"+n.Pods["a"].IP.String()+"/"); err != nil || r.Pod != "a" {
		t.Errorf("direct traffic through the foreign program after cleanup: %+v %v", r, err)
	}
}

// natRules is the IPv4 nat table as iptables-save prints it.
func natRules(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("iptables-save", "-t", "nat").Output()
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// tcxPrograms are the ids of the tcx ingress (or egress) programs of a
// device.
func tcxPrograms(t *testing.T, dev string, egress bool) []ebpf.ProgramID {
	t.Helper()
	ifi, err := net.InterfaceByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	attach := ebpf.AttachTCXIngress
	if egress {
		attach = ebpf.AttachTCXEgress
	}
	res, err := link.QueryPrograms(link.QueryOptions{Target: ifi.Index, Attach: attach})
	if err != nil {
		t.Fatal(err)
	}
	var ids []ebpf.ProgramID
	for _, p := range res.Programs {
		ids = append(ids, p.ID)
	}
	return ids
}

func programID(t *testing.T, p *ebpf.Program) ebpf.ProgramID {
	t.Helper()
	info, err := p.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}

// attached counts the programs of one attach type on a cgroup.
func attached(t *testing.T, cgroup string, a ebpf.AttachType) int {
	return len(programIDs(t, cgroup, a))
}

// TestRestartReadsMapsBack: a restarted backend swaps its programs into
// the pinned links (one program per hook and per device, no gap, no
// duplicate) and reads the maps back, so its first full sync finds every
// frontend as it wants it and writes nothing.
func TestRestartReadsMapsBack(t *testing.T) {
	n := proxytest.NewNode(t, backend, "a", "b")
	n.Svcs = []*corev1.Service{proxytest.Service("web", "10.96.0.10", nil)}
	n.Slices = append(n.Slices, proxytest.Slice("web", n.Local("a"), n.Local("b")))
	n.Sync()
	before := programIDs(t, envs[t].cgroup, ebpf.AttachCGroupInet4Connect)
	tcBefore := tcxPrograms(t, proxytest.Uplink, false)
	n.Backend = n.NewBackend()
	n.Sync()
	if tcAfter := tcxPrograms(t, proxytest.Uplink, false); len(tcBefore) != 1 || len(tcAfter) != 1 || tcAfter[0] == tcBefore[0] {
		t.Fatalf("tcx programs on the uplink %v before the restart, %v after: want one, replaced", tcBefore, tcAfter)
	}
	if st := n.Backend.(*weftebpf.Backend).LastStats(); st.Frontends != 0 || st.UnchangedSkipped != 2 || st.BackendsAdded != 0 || st.BackendsRemoved != 0 {
		t.Fatalf("restarted backend's first sync: %+v, want both frontends compared with what it read back, and left as they are", st)
	}
	after := programIDs(t, envs[t].cgroup, ebpf.AttachCGroupInet4Connect)
	if len(after) != 1 || after[0] == before[0] {
		t.Fatalf("connect4 programs %v before the restart, %v after: want one, replaced", before, after)
	}
	if r, err := proxytest.Get(n.Pods["a"].NS, "", "http://10.96.0.10/"); err != nil || (r.Pod != "a" && r.Pod != "b") {
		t.Fatalf("service after restart: %+v %v", r, err)
	}
	// A change while no proxy ran: the restart's full sync finds it.
	n.Backend.(*weftebpf.Backend).Close()
	n.Slices[len(n.Slices)-1] = proxytest.Slice("web", n.Local("b"))
	n.Backend = n.NewBackend()
	n.Sync()
	if st := n.Backend.(*weftebpf.Backend).LastStats(); st.Frontends != 2 || st.BackendsAdded != 0 {
		t.Fatalf("a restart's first sync after web lost a: %+v, want both frontends rewritten", st)
	}
	for range 10 {
		if r, err := proxytest.Get(n.Pods["a"].NS, "", "http://10.96.0.10/"); err != nil || r.Pod != "b" {
			t.Fatalf("web after it lost a: %+v %v, want b", r, err)
		}
	}
}

// programIDs are the ids of the programs of one attach type on a cgroup.
func programIDs(t *testing.T, cgroup string, a ebpf.AttachType) []ebpf.ProgramID {
	t.Helper()
	f, err := os.Open(cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: a})
	if err != nil {
		t.Fatal(err)
	}
	var ids []ebpf.ProgramID
	for _, p := range res.Programs {
		ids = append(ids, p.ID)
	}
	return ids
}

// TestDump: --dump prints what the maps hold, one frontend per line.
func TestDump(t *testing.T) {
	n := proxytest.NewNode(t, backend, "a", "b")
	n.Svcs = []*corev1.Service{proxytest.Service("web", "10.96.0.10", nil), proxytest.Service("empty", "10.96.0.16", nil)}
	n.Slices = append(n.Slices, proxytest.Slice("web", n.Local("a"), n.Local("b")))
	n.Sync()
	var out strings.Builder
	if err := weftebpf.Dump(envs[t].pin, &out); err != nil {
		t.Fatal(err)
	}
	a, b := n.Pods["a"].IP, n.Pods["b"].IP
	for _, want := range []string{
		fmt.Sprintf("10.96.0.10:80/TCP  forward  -         %s:80 %s:80", a, b),
		fmt.Sprintf("10.96.0.10:81/TCP  forward  -         %s:81 %s:81", a, b),
		"10.96.0.16:80/TCP  reject",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("dump lacks %q:\n%s", want, out.String())
		}
	}
}

// TestLegacyTC: without tcx (forced with Config.TCLegacy) the per-packet
// programs run as cls_bpf filters on a clsact qdisc. NodePort traffic
// from outside is translated behind a foreign filter that runs first; a
// restarted backend replaces weft's filters in place (one per device);
// cleanup removes weft's filters and leaves the foreign one.
func TestLegacyTC(t *testing.T) {
	n := proxytest.NewNode(t, backend, "a")
	e := envs[t]
	newLegacy := func() proxy.Backend {
		b, err := weftebpf.New(weftebpf.Config{NodeName: proxytest.NodeName, NodePortIPs: n.Config.NodePortIPs(),
			CgroupRoot: e.cgroup, PinPath: e.pin, Families: n.Config.Families(), TCLegacy: true})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	n.Backend = newLegacy() // the table's backend never synced: nothing of it to clean
	up, err := netlink.LinkByName(proxytest.Uplink)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "MIT",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()}}) // TC_ACT_UNSPEC: next filter
	if err != nil {
		t.Fatal(err)
	}
	defer foreign.Close()
	if err := netlink.QdiscReplace(&netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: up.Attrs().Index,
		Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.FilterAdd(&netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: up.Attrs().Index,
		Parent: netlink.HANDLE_MIN_INGRESS, Handle: 1, Priority: 1, Protocol: unix.ETH_P_ALL},
		Fd: foreign.FD(), Name: "foreign", DirectAction: true}); err != nil {
		t.Fatal(err)
	}
	n.Svcs = []*corev1.Service{proxytest.Service("np", "10.96.0.11", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = 30080
	})}
	n.Slices = []*discoveryv1.EndpointSlice{proxytest.Slice("np", n.Local("a"))}
	get := func(when string) {
		t.Helper()
		r, err := outsideGet(n.Ext, "", "http://"+proxytest.NodeIP+":30080/")
		if err != nil || r.Pod != "a" || !strings.HasPrefix(r.Client, "10.244.1.") {
			t.Fatalf("%s: %+v %v, want a seeing the node's bridge address", when, r, err)
		}
	}
	type side struct {
		dev    string
		egress bool
	}
	want := map[side][]string{{proxytest.Uplink, false}: {"foreign", "weft_nodeport"}, {proxytest.Uplink, true}: {"weft_reply"},
		{proxytest.Bridge, false}: nil, {proxytest.Bridge, true}: nil}
	check := func(when string) {
		t.Helper()
		for s, names := range want {
			if got := filterNames(t, s.dev, s.egress); !slices.Equal(got, names) {
				t.Fatalf("%s: filters on %s (egress %v): %v, want %v", when, s.dev, s.egress, got, names)
			}
		}
	}
	n.Sync()
	get("NodePort from outside")
	check("first sync")
	n.Backend = newLegacy()
	n.Sync()
	get("after a restart")
	check("after a restart")
	if err := n.Backend.Cleanup(); err != nil {
		t.Fatal(err)
	}
	want = map[side][]string{{proxytest.Uplink, false}: {"foreign"}, {proxytest.Uplink, true}: nil}
	check("after cleanup")
}

// filterNames are the names of the cls_bpf filters on a device's clsact
// ingress (or egress), in priority order.
func filterNames(t *testing.T, dev string, egress bool) []string {
	t.Helper()
	l, err := netlink.LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	parent := uint32(netlink.HANDLE_MIN_INGRESS)
	if egress {
		parent = netlink.HANDLE_MIN_EGRESS
	}
	filters, err := netlink.FilterList(l, parent)
	if err != nil {
		return nil // no clsact qdisc
	}
	slices.SortFunc(filters, func(a, b netlink.Filter) int { return int(a.Attrs().Priority) - int(b.Attrs().Priority) })
	var names []string
	for _, f := range filters {
		if bf, ok := f.(*netlink.BpfFilter); ok {
			names = append(names, strings.SplitN(bf.Name, ":", 2)[0])
		}
	}
	return names
}

// TestExternalFlowSurvivesRestart: a connection from outside to a NodePort
// (eTP Cluster: translated both ways by the per-packet programs) keeps
// working across a restart of the backend: the conntrack maps are pinned
// and the new programs take over the links.
func TestExternalFlowSurvivesRestart(t *testing.T) {
	n := proxytest.NewNode(t, backend, "a", "b")
	n.Svcs = []*corev1.Service{proxytest.Service("np", "10.96.0.11", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = 30080
		s.Spec.Ports[1].NodePort = 30081
	})}
	n.Slices = []*discoveryv1.EndpointSlice{proxytest.Slice("np", n.Local("a"), n.Local("b"))}
	n.Sync()
	addr := proxytest.NodeIP + ":30081"
	if _, err := outsideEcho(n.Ext, addr, "hello"); err != nil {
		t.Fatalf("before the restart: %v", err)
	}
	n.Backend = n.NewBackend()
	n.Sync()
	if _, err := outsideEcho(n.Ext, addr, "after the restart"); err != nil {
		t.Fatalf("after the restart: %v", err)
	}
}

// TestUpgradeFromBridgeReplies: a node where an earlier version left its
// reply program on the pod bridge (pinned tcx link) and a conntrack map of
// another layout: the first sync removes the bridge's program, replaces
// the map, and NodePort traffic from outside works.
func TestUpgradeFromBridgeReplies(t *testing.T) {
	n := proxytest.NewNode(t, backend, "a")
	pin := envs[t].pin
	if err := os.MkdirAll(pin, 0o700); err != nil {
		t.Fatal(err)
	}
	old, err := ebpf.NewMap(&ebpf.MapSpec{Name: "weft_ct", Type: ebpf.LRUHash, KeySize: 40, ValueSize: 48, MaxEntries: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := old.Pin(filepath.Join(pin, "weft_ct")); err != nil {
		t.Fatal(err)
	}
	prog := passTC(t, "weft_reply")
	br, err := net.InterfaceByName(proxytest.Bridge)
	if err != nil {
		t.Fatal(err)
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: br.Index, Program: prog, Attach: ebpf.AttachTCXIngress})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Pin(filepath.Join(pin, fmt.Sprintf("tcx_%d", br.Index))); err != nil {
		t.Fatal(err)
	}
	_ = l.Close() // the pin holds it
	n.Svcs = []*corev1.Service{proxytest.Service("np", "10.96.0.11", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = 30080
	})}
	n.Slices = []*discoveryv1.EndpointSlice{proxytest.Slice("np", n.Local("a"))}
	n.Sync()
	if got := tcxPrograms(t, proxytest.Bridge, false); len(got) != 0 {
		t.Fatalf("tcx programs on the pod bridge after the first sync: %v, want none", got)
	}
	if r, err := outsideGet(n.Ext, "", "http://"+proxytest.NodeIP+":30080/"); err != nil || r.Pod != "a" {
		t.Fatalf("NodePort from outside after the upgrade: %+v %v", r, err)
	}
	cur, err := ebpf.LoadPinnedMap(filepath.Join(pin, "weft_ct"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()
	if cur.ValueSize() == old.ValueSize() {
		t.Fatalf("the pinned weft_ct still has the earlier layout (values of %d bytes)", cur.ValueSize())
	}
}

// passTC is a tc program named name that passes every packet (TC_ACT_OK),
// closed at the end of the test.
func passTC(t *testing.T, name string) *ebpf.Program {
	t.Helper()
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: name, Type: ebpf.SchedCLS, License: "MIT",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// TestPrepare: Prepare (weft-proxy runs it while the informers list the
// cluster) loads the programs and reads the pinned maps back, but
// attaches nothing and leaves what the programs read alone: on a new node
// no program is attached before the first sync, and after a restart the
// previous programs serve the previous state until the first sync swaps
// the new ones in and writes the whole cluster view.
func TestPrepare(t *testing.T) {
	n := proxytest.NewNode(t, backend, "a", "b")
	cg := envs[t].cgroup
	b := n.Backend.(*weftebpf.Backend)
	if err := b.Prepare(); err != nil {
		t.Fatal(err)
	}
	if ids := programIDs(t, cg, ebpf.AttachCGroupInet4Connect); len(ids) != 0 {
		t.Fatalf("connect4 programs %v after Prepare, want none before the first sync", ids)
	}
	n.Svcs = []*corev1.Service{proxytest.Service("web", "10.96.0.10", nil)}
	n.Slices = append(n.Slices, proxytest.Slice("web", n.Local("a")))
	n.Sync()
	if st := b.LastStats(); st.Frontends != 2 || st.BackendsAdded != 2 {
		t.Fatalf("first sync after Prepare: %+v, want both frontends and a's 2 backends written", st)
	}
	get := func(when string) {
		t.Helper()
		if r, err := proxytest.Get(n.Pods["b"].NS, "", "http://10.96.0.10/"); err != nil || r.Pod != "a" {
			t.Fatalf("service %s: %+v %v, want pod a", when, r, err)
		}
	}
	get("after the first sync")
	before := programIDs(t, cg, ebpf.AttachCGroupInet4Connect)
	n.Backend = n.NewBackend()
	restarted := n.Backend.(*weftebpf.Backend)
	if err := restarted.Prepare(); err != nil {
		t.Fatal(err)
	}
	if ids := programIDs(t, cg, ebpf.AttachCGroupInet4Connect); !slices.Equal(ids, before) {
		t.Fatalf("connect4 programs %v after a restarted backend's Prepare, want the previous %v until its first sync", ids, before)
	}
	get("after a restarted backend's Prepare")
	n.Sync()
	if after := programIDs(t, cg, ebpf.AttachCGroupInet4Connect); len(after) != 1 || after[0] == before[0] {
		t.Fatalf("connect4 programs %v before the restart's first sync, %v after: want one, replaced", before, after)
	}
	if st := restarted.LastStats(); st.Frontends != 0 || st.UnchangedSkipped != 2 || st.BackendsAdded != 0 {
		t.Fatalf("restarted backend's first sync: %+v, want both frontends compared with what it read back, and left as they are", st)
	}
	get("after the restarted backend's first sync")
}

// TestConnectionStorm: a storm of short connections from outside through
// a NodePort (each opened, asked a line, closed), four times as many as
// the conntrack maps hold (--bpf-ct-max 1024), leaves the maps nearly
// empty (a closed connection's entries go with it) and a long-lived
// connection opened before it, idle meanwhile, working. With
// WEFT_EBPF_STORM=N (make bench: a million) it runs N connections on maps
// of the default size and logs the connection rate of the first 5,000
// (empty maps) and of the rest.
func TestConnectionStorm(t *testing.T) {
	storm, ctMax := 4*weftebpf.MinCTMax, weftebpf.MinCTMax
	if v := os.Getenv("WEFT_EBPF_STORM"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 5000 {
			t.Fatalf("WEFT_EBPF_STORM=%q: want a number of connections above 5000", v)
		}
		storm, ctMax = n, 0
	}
	n := proxytest.NewNode(t, backend, "a", "b")
	_ = n.Backend.Cleanup()
	n.Config.BPFCTMax = ctMax
	n.Backend = n.NewBackend()
	n.Svcs = []*corev1.Service{proxytest.Service("np", "10.96.0.11", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = 30080
		s.Spec.Ports[1].NodePort = 30081
	})}
	n.Slices = []*discoveryv1.EndpointSlice{proxytest.Slice("np", n.Local("a"), n.Local("b"))}
	n.Sync()
	long := proxytest.NodeIP + ":30081"
	if _, err := outsideEcho(n.Ext, long, "hello"); err != nil {
		t.Fatalf("the long-lived connection: %v", err)
	}
	pin := envs[t].pin
	size := int(pinnedMap(t, filepath.Join(pin, "weft_ct")).MaxEntries())
	if (ctMax != 0 && size != ctMax) || (ctMax == 0 && size < weftebpf.CTMaxFor(0)) {
		t.Fatalf("weft_ct holds %d entries at most, want --bpf-ct-max's %d (0: sized from memory, at least %d)", size, ctMax, weftebpf.CTMaxFor(0))
	}
	// The outside host reuses its ports in TIME_WAIT for new connections
	// (its 28,000 ephemeral ports last a storm of 2,000 a second for 14 s
	// otherwise): what the rates compare is the node's path, not the
	// client's port search.
	if err := netnsutil.Do(n.Ext, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/tcp_tw_reuse", []byte("1"), 0o644)
	}); err != nil {
		t.Fatal(err)
	}
	rate := func(k int) float64 {
		t.Helper()
		start := time.Now()
		if _, err := outsideDo(outsideRequest{NS: n.Ext, Addr: long, Short: k}); err != nil {
			t.Fatalf("the storm: %v", err)
		}
		return float64(k) / time.Since(start).Seconds()
	}
	first := min(5000, storm/4)
	idle := rate(first)
	rest := rate(storm - first)
	t.Logf("%d short connections: %.0f/s for the first %d, %.0f/s for the other %d (%.3f×)", storm, idle, first, rest, storm-first, rest/idle)
	for _, m := range []string{"weft_ct", "weft_nat_rev"} {
		if got := entries(t, filepath.Join(pin, m)); got > weftebpf.MinCTMax/10 {
			t.Errorf("%s holds %d entries after the storm, want the closed connections' gone", m, got)
		}
	}
	if _, err := outsideEcho(n.Ext, long, "after the storm"); err != nil {
		t.Fatalf("the long-lived connection after the storm: %v", err)
	}
}

// TestHandOverToAnotherMode: the iptables mode taking over a node from the
// eBPF mode keeps a connection from outside to a NodePort and one from a
// pod to a ClusterIP that the eBPF mode translated, detaches the socket
// programs at once, and removes the rest once the connection from outside
// has closed.
func TestHandOverToAnotherMode(t *testing.T) {
	every := proxy.EBPFDrainEvery
	proxy.EBPFDrainEvery = 200 * time.Millisecond
	t.Cleanup(func() { proxy.EBPFDrainEvery = every })
	n := proxytest.NewNode(t, backend, "a", "b")
	n.Svcs = []*corev1.Service{proxytest.Service("np", "10.96.0.11", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = 30080
		s.Spec.Ports[1].NodePort = 30081
	})}
	n.Slices = []*discoveryv1.EndpointSlice{proxytest.Slice("np", n.Local("a"), n.Local("b"))}
	n.Sync()
	outsideAddr := proxytest.NodeIP + ":30081"
	if _, err := outsideEcho(n.Ext, outsideAddr, "hello"); err != nil {
		t.Fatalf("from outside, under ebpf: %v", err)
	}
	var pod net.Conn
	if err := netnsutil.Do(n.Pods["b"].NS, func() (err error) { pod, err = net.DialTimeout("tcp", "10.96.0.11:81", time.Second); return err }); err != nil {
		t.Fatal(err)
	}
	defer pod.Close()
	echo := proxytest.NewEcho(pod)
	if err := echo.Say("hello"); err != nil {
		t.Fatalf("from a pod, under ebpf: %v", err)
	}

	// The eBPF mode's process ends; the iptables mode's starts.
	n.Backend.(*weftebpf.Backend).Close()
	c := n.Config
	c.Mode = "iptables"
	p := proxytest.RunProxier(t, c)
	for _, s := range n.Svcs {
		p.OnService(nil, s)
	}
	for _, es := range n.Slices {
		p.OnEndpointSlice(nil, es)
	}
	p.OnSynced()
	testutil.Eventually(t, 10*time.Second, "the iptables mode's first sync", p.Healthy)
	if got := attached(t, envs[t].cgroup, ebpf.AttachCGroupInet4Connect); got != 0 {
		t.Errorf("%d connect programs still on the cgroup after the hand-over", got)
	}
	if _, err := outsideEcho(n.Ext, outsideAddr, "after the hand-over"); err != nil {
		t.Errorf("from outside, after the hand-over: %v", err)
	}
	if err := echo.Say("after the hand-over"); err != nil {
		t.Errorf("from a pod, after the hand-over: %v", err)
	}
	if _, err := outsideGet(n.Ext, "", "http://"+proxytest.NodeIP+":30080/"); err != nil {
		t.Errorf("a new connection from outside, after the hand-over: %v", err)
	}
	// The connection from outside ends: the rest goes.
	outside.stop()
	outside = nil
	testutil.Eventually(t, 10*time.Second, "the retired eBPF mode removed", func() bool {
		_, err := os.Stat(envs[t].pin)
		return os.IsNotExist(err)
	})
	if got := tcxPrograms(t, proxytest.Uplink, false); len(got) != 0 {
		t.Errorf("%d programs left on the uplink's ingress", len(got))
	}
}
