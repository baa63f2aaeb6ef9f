package iptables_test

import (
	"bufio"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/proxy/iptables"
	"github.com/weftnet/weft/proxy/model"
)

// TestServiceTraffic programs Services through the iptables backend and
// proves each feature with real connections: who answered and what source
// address the server saw.
func TestServiceTraffic(t *testing.T) {
	n := newNode(t, "a", "b", "c")
	a, b, c := n.pods["a"], n.pods["b"], n.pods["c"]
	for name, want := range map[string]string{"a": podA, "b": podB, "c": podC} {
		if got := n.pods[name].ip.String(); got != want {
			t.Fatalf("pod %s got %s from IPAM, the scenario expects %s", name, got, want)
		}
	}
	n.svcs, n.slices = scenario()
	n.sync()

	t.Run("ClusterIP from a pod spreads over endpoints, source kept", func(t *testing.T) {
		seen := map[string]bool{}
		for i := 0; i < 30; i++ {
			r, err := get(a.ns, "", "http://10.96.0.10/")
			if err != nil {
				t.Fatal(err)
			}
			// Only a hairpin (a answering itself) is masqueraded.
			if r.Pod != "a" && r.Client != a.ip.String() {
				t.Fatalf("%s saw %s, want the pod's own %s", r.Pod, r.Client, a.ip)
			}
			seen[r.Pod] = true
		}
		if len(seen) < 2 {
			t.Fatalf("30 requests all went to %v", seen)
		}
	})
	t.Run("ClusterIP from the node", func(t *testing.T) {
		if _, err := get("", "", "http://10.96.0.10/"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("NodePort from outside is masqueraded", func(t *testing.T) {
		for i := 0; i < 5; i++ {
			r, err := get(n.ext, "", "http://"+nodeIP+":30080/")
			if err != nil {
				t.Fatal(err)
			}
			if r.Pod != "b" && r.Pod != "c" {
				t.Fatalf("answered by %s, not an endpoint of np", r.Pod)
			}
			if r.Client == extIP || !strings.HasPrefix(r.Client, "10.244.1.") {
				t.Fatalf("%s saw %s, want the node's address (SNAT)", r.Pod, r.Client)
			}
		}
	})
	t.Run("externalTrafficPolicy Local keeps the client address and the local endpoint", func(t *testing.T) {
		for i := 0; i < 8; i++ {
			r, err := get(n.ext, "", "http://"+nodeIP+":30081/")
			if err != nil {
				t.Fatal(err)
			}
			if r.Pod != "c" || r.Client != extIP {
				t.Fatalf("%s saw %s, want c seeing %s", r.Pod, r.Client, extIP)
			}
		}
	})
	t.Run("externalTrafficPolicy Local without a local endpoint drops", func(t *testing.T) {
		_, err := get(n.ext, "", "http://"+nodeIP+":30082/")
		if err == nil || strings.Contains(err.Error(), "refused") {
			t.Fatalf("got %v, want a timeout (dropped)", err)
		}
	})
	t.Run("LoadBalancer IP allowed and blocked by sourceRanges", func(t *testing.T) {
		r, err := get(n.ext, extIP, "http://"+lbIP+"/")
		if err != nil || r.Pod != "b" {
			t.Fatalf("from %s: %+v %v, want b", extIP, r, err)
		}
		if r, err := get(n.ext, extIP2, "http://"+lbIP+"/"); err == nil {
			t.Fatalf("from %s (outside sourceRanges) answered by %s", extIP2, r.Pod)
		}
	})
	t.Run("ClientIP affinity sticks", func(t *testing.T) {
		first := ""
		for i := 0; i < 15; i++ {
			r, err := get(b.ns, "", "http://10.96.0.15/")
			if err != nil {
				t.Fatal(err)
			}
			if first == "" {
				first = r.Pod
			}
			if r.Pod != first {
				t.Fatalf("request %d went to %s, the first to %s", i, r.Pod, first)
			}
		}
	})
	t.Run("no endpoints is rejected at once", func(t *testing.T) {
		_, err := get(c.ns, "", "http://10.96.0.16/")
		if err == nil || !strings.Contains(err.Error(), "refused") {
			t.Fatalf("got %v, want connection refused", err)
		}
	})
	t.Run("hairpin: a pod reaches itself through its service", func(t *testing.T) {
		r, err := get(a.ns, "", "http://10.96.0.21/")
		if err != nil || r.Pod != "a" {
			t.Fatalf("%+v %v", r, err)
		}
	})
}

// TestPartialSyncAndRestart: one endpoint change rewrites a few chains, not
// all; a fresh backend (a restarted proxy) does a full sync under an open
// connection, which keeps working.
func TestPartialSyncAndRestart(t *testing.T) {
	n := newNode(t, "a", "b")
	a, b := n.pods["a"], n.pods["b"]
	for i := 0; i < 20; i++ {
		ip := fmt.Sprintf("10.96.1.%d", i+1)
		n.svcs = append(n.svcs, service(fmt.Sprintf("s%d", i), ip, nil))
		n.slices = append(n.slices, slice(fmt.Sprintf("s%d", i), n.local("a")))
	}
	full := n.sync()
	if !full.Full {
		t.Fatalf("first sync not full: %+v", full)
	}
	n.slices[3] = slice("s3", n.local("a"), n.local("b"))
	part := n.sync()
	if part.Full || part.Chains == 0 || part.Chains > 6 {
		t.Fatalf("one endpoint change rewrote %d chains (full sync wrote %d)", part.Chains, full.Chains)
	}

	var conn net.Conn
	if err := netnsutil.Do(b.ns, func() (err error) {
		conn, err = net.DialTimeout("tcp", "10.96.1.1:81", 2*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	talk := func(msg string) {
		t.Helper()
		_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
		fmt.Fprintln(conn, msg)
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatalf("after %q: %v", msg, err)
		}
	}
	talk("hello")
	restarted := iptables.New(nodeConfig(), []int{4, 6}, iptables.Exec{})
	n.backend = restarted
	// The chains in the kernel are recognised by name: a restart rewrites
	// only the fixed-name chains and deletes nothing.
	ms, _ := model.Build(n.svcs, n.slices)
	fixed := 0
	for _, c := range iptables.Render(nodeConfig(), ms, 4).Chains {
		if c.Fixed {
			fixed++
		}
	}
	if st := n.sync(); !st.Full || st.Chains != fixed || st.Deleted > 0 {
		t.Fatalf("a new backend's first sync: %+v, want a full sync of the %d fixed chains only", st, fixed)
	}
	talk("after restart")
	if r, err := get(a.ns, "", "http://10.96.1.4/"); err != nil {
		t.Fatalf("service after restart: %+v %v", r, err)
	}
}

// TestChunkedSync: a sync larger than one restore's bound is split, leaves
// first, and gives the same working services; shrinking it back deletes
// the chains no longer used.
func TestChunkedSync(t *testing.T) {
	n := newNode(t, "a", "b")
	n.backend.SetChunkRules(3)
	for i := range 12 {
		ip := fmt.Sprintf("10.96.%d.%d", i%3, i+1)
		n.svcs = append(n.svcs, service(fmt.Sprintf("s%d", i), ip, nil))
		n.slices = append(n.slices, slice(fmt.Sprintf("s%d", i), n.local("a"), n.local("b")))
	}
	if st := n.sync(); st.Restores < 5 {
		t.Fatalf("first sync of %d rules in %d restores, want it split", st.Rules, st.Restores)
	}
	for i := range 12 {
		url := fmt.Sprintf("http://10.96.%d.%d/", i%3, i+1)
		if r, err := get(n.pods["a"].ns, "", url); err != nil || (r.Pod != "a" && r.Pod != "b") {
			t.Fatalf("%s: %+v %v", url, r, err)
		}
	}
	n.svcs, n.slices = n.svcs[:1], n.slices[:1]
	st := n.sync()
	if st.Deleted == 0 {
		t.Fatalf("shrinking deleted nothing: %+v", st)
	}
	out, err := exec.Command("iptables-save", "-t", "nat").Output()
	if err != nil {
		t.Fatal(err)
	}
	ms, _ := model.Build(n.svcs, n.slices)
	want := strings.Count(iptables.Payload(iptables.Render(nodeConfig(), ms, 4)), ":WEFT-LB-")
	if lb := strings.Count(string(out), ":WEFT-LB-"); lb != want {
		t.Fatalf("%d load-balancing chains left, the remaining service has %d:\n%s", lb, want, out)
	}
	if r, err := get(n.pods["b"].ns, "", "http://10.96.0.1/"); err != nil {
		t.Fatalf("remaining service: %+v %v", r, err)
	}
}

// TestPolicyJumpsStayFirst: the proxy inserts its jumps below weft-agent's
// NetworkPolicy jumps, so that service traffic the proxy's FORWARD chain
// accepts has been through policy first.
func TestPolicyJumpsStayFirst(t *testing.T) {
	n := newNode(t, "a")
	t.Cleanup(func() {
		for _, args := range [][]string{{"-D", "FORWARD", "-j", "WEFT-POL-FORWARD"}, {"-D", "FORWARD", "-s", "198.51.100.3/32", "-j", "DROP"}, {"-X", "WEFT-POL-FORWARD"}} {
			_ = exec.Command("iptables", args...).Run()
		}
		_ = n.backend.Cleanup()
	})
	for _, args := range [][]string{
		{"-N", "WEFT-POL-FORWARD"}, {"-A", "FORWARD", "-s", "198.51.100.3/32", "-j", "DROP"},
		{"-I", "FORWARD", "1", "-j", "WEFT-POL-FORWARD"},
	} {
		if out, err := exec.Command("iptables", args...).CombinedOutput(); err != nil {
			t.Fatalf("iptables %v: %v %s", args, err, out)
		}
	}
	n.svcs = []*corev1.Service{service("web", "10.96.0.10", nil)}
	n.slices = []*discoveryv1.EndpointSlice{slice("web", n.local("a"))}
	n.sync()
	out, err := exec.Command("iptables", "-S", "FORWARD").Output()
	if err != nil {
		t.Fatal(err)
	}
	rules := strings.Split(strings.TrimSpace(string(out)), "\n")[1:] // after "-P FORWARD ..."
	if len(rules) < 4 || !strings.HasSuffix(rules[0], "-j WEFT-POL-FORWARD") || !strings.HasSuffix(rules[len(rules)-1], "-j DROP") {
		t.Fatalf("FORWARD after a proxy sync, want the policy jump first and the foreign rule last:\n%s", out)
	}
}

// TestForeignRulesSurvive: rules weft does not own survive syncs and cleanup.
func TestForeignRulesSurvive(t *testing.T) {
	n := newNode(t, "a")
	for _, args := range [][]string{
		{"-t", "nat", "-N", "FOREIGN"}, {"-t", "nat", "-A", "FOREIGN", "-d", "198.51.100.1/32", "-j", "RETURN"},
		{"-t", "nat", "-A", "PREROUTING", "-j", "FOREIGN"}, {"-t", "filter", "-A", "FORWARD", "-s", "198.51.100.2/32", "-j", "DROP"},
	} {
		if out, err := exec.Command("iptables", args...).CombinedOutput(); err != nil {
			t.Fatalf("iptables %v: %v %s", args, err, out)
		}
	}
	n.svcs = []*corev1.Service{service("web", "10.96.0.10", nil)}
	n.slices = []*discoveryv1.EndpointSlice{slice("web", n.local("a"))}
	n.sync()
	n.slices = nil
	n.sync()
	if err := n.backend.Cleanup(); err != nil {
		t.Fatal(err)
	}
	save := func(table string) string {
		out, err := exec.Command("iptables-save", "-t", table).Output()
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	nat, filter := save("nat"), save("filter")
	for _, want := range []string{"-A FOREIGN -d 198.51.100.1/32 -j RETURN", "-A PREROUTING -j FOREIGN"} {
		if !strings.Contains(nat, want) {
			t.Errorf("foreign nat rule %q gone:\n%s", want, nat)
		}
	}
	if !strings.Contains(filter, "-A FORWARD -s 198.51.100.2/32 -j DROP") {
		t.Errorf("foreign filter rule gone:\n%s", filter)
	}
	if strings.Contains(nat+filter, "WEFT-") {
		t.Errorf("weft rules left after cleanup:\n%s%s", nat, filter)
	}
}

// TestIPv6Service: a dual-stack Service answers on its IPv6 ClusterIP from a
// pod (source kept) and on the node's IPv6 address as a NodePort (SNAT).
func TestIPv6Service(t *testing.T) {
	n := newNode(t, "a", "b")
	a := n.pods["a"]
	n.svcs = []*corev1.Service{service("dual", "10.96.0.20", func(s *corev1.Service) {
		s.Spec.ClusterIPs = []string{"10.96.0.20", "fd00:96::20"}
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = 30090
	})}
	v6 := slice("dual", endpoint{n.pods["b"].ip6.String(), nodeName})
	v6.Name, v6.AddressType = "dual-v6", discoveryv1.AddressTypeIPv6
	n.slices = []*discoveryv1.EndpointSlice{slice("dual", n.local("b")), v6}
	n.sync()
	r, err := get(a.ns, "", "http://[fd00:96::20]/")
	if err != nil || r.Pod != "b" || r.Client != a.ip6.String() {
		t.Fatalf("IPv6 ClusterIP from a: %+v %v, want b seeing %s", r, err, a.ip6)
	}
	r, err = get(n.ext, "", "http://["+nodeIP6+"]:30090/")
	if err != nil || r.Pod != "b" || r.Client == extIP6 {
		t.Fatalf("IPv6 NodePort from outside: %+v %v, want b seeing a node address", r, err)
	}
	if r, err := get(a.ns, "", "http://10.96.0.20/"); err != nil || r.Pod != "b" {
		t.Fatalf("IPv4 ClusterIP of the same Service: %+v %v", r, err)
	}
}
