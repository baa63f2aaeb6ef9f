package ebpf_test

import (
	"os"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	weftebpf "github.com/weftnet/weft/proxy/ebpf"
	"github.com/weftnet/weft/proxy/proxytest"
	"github.com/weftnet/weft/routing"
)

// TestDSRTunnelDevice: in dsr mode the backend runs the receive side on
// the VXLAN device's ingress (DSR packets of other nodes arrive there
// decapsulated) and sets the device's rp_filter loose; a NodePort with a
// local endpoint answers as in snat mode; cleanup takes the program off
// the device. A bad --bpf-lb-mode is refused naming the flag.
func TestDSRTunnelDevice(t *testing.T) {
	n := proxytest.NewNode(t, backend, "a")
	e := envs[t]
	la := netlink.NewLinkAttrs()
	la.Name = routing.DefaultDevice
	if err := netlink.LinkAdd(&netlink.Vxlan{LinkAttrs: la, VxlanId: 1, Port: 8472}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(routing.DefaultDevice); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	rp := "/proc/sys/net/ipv4/conf/" + routing.DefaultDevice + "/rp_filter"
	if err := os.WriteFile(rp, []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := weftebpf.Config{NodeName: proxytest.NodeName, NodePortIPs: n.Config.NodePortIPs(),
		CgroupRoot: e.cgroup, PinPath: e.pin, Families: n.Config.Families()}
	cfg.LBMode = "direct"
	if _, err := weftebpf.New(cfg); err == nil || !strings.Contains(err.Error(), "--bpf-lb-mode") {
		t.Fatalf("New with --bpf-lb-mode direct: %v, want an error naming the flag", err)
	}
	cfg.LBMode = weftebpf.LBModeDSR
	b, err := weftebpf.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n.Backend = b
	n.Svcs = []*corev1.Service{proxytest.Service("np", "10.96.0.11", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = 30080
	})}
	n.Slices = []*discoveryv1.EndpointSlice{proxytest.Slice("np", n.Local("a"))}
	n.Sync()
	r, err := outsideGet(n.Ext, "", "http://"+proxytest.NodeIP+":30080/")
	if err != nil || r.Pod != "a" || !strings.HasPrefix(r.Client, "10.244.1.") {
		t.Fatalf("NodePort from outside: %+v %v, want a seeing the node's bridge address (a local backend: masqueraded as in snat mode)", r, err)
	}
	names := func() []string {
		var out []string
		for _, id := range tcxPrograms(t, routing.DefaultDevice, false) {
			p, err := ebpf.NewProgramFromID(id)
			if err != nil {
				t.Fatal(err)
			}
			info, err := p.Info()
			_ = p.Close()
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, info.Name)
		}
		return out
	}
	if got := names(); len(got) != 1 || got[0] != "weft_nodeport" {
		t.Fatalf("programs on %s's ingress: %v, want weft_nodeport", routing.DefaultDevice, got)
	}
	if v, err := os.ReadFile(rp); err != nil || strings.TrimSpace(string(v)) != "2" {
		t.Fatalf("%s: %q %v, want 2 (loose)", rp, v, err)
	}
	if err := n.Backend.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if got := names(); len(got) != 0 {
		t.Fatalf("programs on %s's ingress after cleanup: %v", routing.DefaultDevice, got)
	}
}
