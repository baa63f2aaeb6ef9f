package ebpf_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/weftnet/weft/proxy"
	weftebpf "github.com/weftnet/weft/proxy/ebpf"
	"github.com/weftnet/weft/proxy/proxytest"
)

// xdpBackend is the eBPF backend with --bpf-xdp mode.
func xdpBackend(mode string) proxytest.Backend {
	x := backend
	x.Setup = func(t *testing.T, c *proxy.Config) {
		setup(t, c)
		c.BPFXDP = mode
	}
	return x
}

// TestXDPRealTraffic: an outside client's connections through the node's
// uplink (a veth) with weft_nodeport_xdp in generic and in native mode:
// eTP Local reaches the local endpoint with the client's address, eTP
// Cluster is masqueraded, and the XDP program (its counters, not tc's
// path) translated the packets, handing none to tc.
func TestXDPRealTraffic(t *testing.T) {
	for _, mode := range []string{weftebpf.XDPGeneric, weftebpf.XDPNative} {
		t.Run(mode, func(t *testing.T) {
			n := proxytest.NewNode(t, xdpBackend(mode), "a", "b", "c")
			n.Svcs, n.Slices = proxytest.Scenario()
			n.Sync()
			b := n.Backend.(*weftebpf.Backend)
			if got := b.XDPModes()[proxytest.Uplink]; got != mode {
				t.Fatalf("uplink %s runs %q, want %s (all: %v)", proxytest.Uplink, got, mode, b.XDPModes())
			}
			before, err := b.XDPStats()
			if err != nil {
				t.Fatal(err)
			}
			r, err := n.GetOutside("", "http://"+proxytest.NodeIP+":30081/")
			if err != nil || r.Pod != "c" || r.Client != proxytest.ExtIP {
				t.Fatalf("eTP Local: %+v %v, want c seeing %s", r, err, proxytest.ExtIP)
			}
			r, err = n.GetOutside("", "http://"+proxytest.NodeIP+":30080/")
			if err != nil || (r.Pod != "b" && r.Pod != "c") || !strings.HasPrefix(r.Client, "10.244.1.") {
				t.Fatalf("eTP Cluster: %+v %v, want b or c seeing the node's address", r, err)
			}
			after, err := b.XDPStats()
			if err != nil {
				t.Fatal(err)
			}
			// Each HTTP connection sends at least SYN, ACK, request and
			// FIN from the client: 4 packets each at least.
			if got := after["translated"] - before["translated"]; got < 8 {
				t.Fatalf("XDP translated %d packets of the two connections, want at least 8", got)
			}
			if got := after["handoff"] - before["handoff"]; got != 0 {
				t.Fatalf("XDP handed %d packets to tc, want none", got)
			}
		})
	}
}

// TestXDPBadDevice: --bpf-xdp native on a device whose driver has no
// native XDP (a TUN device) fails the sync with an error naming the
// device and the flag; auto falls back to tc on it and says so (the
// device's mode is tc).
func TestXDPBadDevice(t *testing.T) {
	for _, mode := range []string{weftebpf.XDPNative, weftebpf.XDPAuto} {
		t.Run(mode, func(t *testing.T) {
			n := proxytest.NewNode(t, xdpBackend(weftebpf.XDPOff), "a")
			tun := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: "xdptun0"}, Mode: netlink.TUNTAP_MODE_TUN,
				Flags: netlink.TUNTAP_DEFAULTS | netlink.TUNTAP_NO_PI}
			if err := netlink.LinkAdd(tun); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = netlink.LinkDel(tun) })
			if err := netlink.LinkSetUp(tun); err != nil {
				t.Fatal(err)
			}
			n.Config.BPFXDP, n.Config.BPFDevices = mode, []string{proxytest.Uplink, "xdptun0"}
			_ = n.Backend.Cleanup()
			n.Backend = n.NewBackend()
			n.Svcs, n.Slices = proxytest.Scenario()
			err := syncErr(t, n)
			if mode == weftebpf.XDPNative {
				if err == nil || !strings.Contains(err.Error(), "xdptun0") || !strings.Contains(err.Error(), "--bpf-xdp native") {
					t.Fatalf("sync: %v, want an error naming --bpf-xdp native and xdptun0", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			modes := n.Backend.(*weftebpf.Backend).XDPModes()
			if modes["xdptun0"] != "tc" || modes[proxytest.Uplink] != weftebpf.XDPNative {
				t.Fatalf("modes %v, want xdptun0 on tc and %s native", modes, proxytest.Uplink)
			}
		})
	}
}

// TestXDPFlag: a bad --bpf-xdp value is refused naming the flag.
func TestXDPFlag(t *testing.T) {
	for _, ok := range []string{"", "off", "auto", "native", "generic"} {
		if err := weftebpf.CheckXDPMode(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	if err := weftebpf.CheckXDPMode("driver"); err == nil || !strings.Contains(err.Error(), "--bpf-xdp") {
		t.Fatalf("driver: %v, want an error naming --bpf-xdp", err)
	}
}

// TestXDPModeSwitch: an outside client's TCP connection to an eTP Cluster
// NodePort keeps working while the proxy restarts in native XDP, generic
// XDP, off (tc only) and native again: the flow's state is the one both
// hooks use. After each restart the uplink runs the program in the mode
// asked for (the other mode's link removed) or none, and in the XDP modes
// the new program translated the connection's packets.
func TestXDPModeSwitch(t *testing.T) {
	n := proxytest.NewNode(t, xdpBackend(weftebpf.XDPNative), "a")
	n.Svcs = []*corev1.Service{proxytest.Service("echo", "10.96.0.50", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports[1].NodePort = 30181
	})}
	n.Slices = []*discoveryv1.EndpointSlice{proxytest.Slice("echo", n.Local("a"))}
	n.Sync()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := backend.OutsideDialer(n.Ext)(ctx, "tcp", proxytest.NodeIP+":30181")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	echo := proxytest.NewEcho(conn)
	attach := map[string]uint32{weftebpf.XDPNative: nl.XDP_ATTACHED_DRV, weftebpf.XDPGeneric: nl.XDP_ATTACHED_SKB, weftebpf.XDPOff: nl.XDP_ATTACHED_NONE}
	for i, mode := range []string{weftebpf.XDPNative, weftebpf.XDPGeneric, weftebpf.XDPOff, weftebpf.XDPNative} {
		if i > 0 {
			// A restart: the old process's links and maps close, what is
			// pinned stays.
			n.Backend.(*weftebpf.Backend).Close()
			n.Config.BPFXDP = mode
			n.Backend = n.NewBackend()
			n.Sync()
		}
		if err := echo.Say("in " + mode); err != nil {
			t.Fatalf("in %s: %v", mode, err)
		}
		l, err := netlink.LinkByName(proxytest.Uplink)
		if err != nil {
			t.Fatal(err)
		}
		got := uint32(nl.XDP_ATTACHED_NONE)
		if l.Attrs().Xdp != nil && l.Attrs().Xdp.Attached {
			got = l.Attrs().Xdp.AttachMode
		}
		if got != attach[mode] {
			t.Fatalf("--bpf-xdp %s: the uplink's XDP attach mode is %d, want %d", mode, got, attach[mode])
		}
		st, err := n.Backend.(*weftebpf.Backend).XDPStats()
		if err != nil {
			t.Fatal(err)
		}
		if (st["translated"] > 0) != (mode != weftebpf.XDPOff) {
			t.Fatalf("--bpf-xdp %s: XDP counters %v", mode, st)
		}
	}
}

// TestXDPReattach: the XDP program detached behind weft's back shows as
// detached (weft_ebpf_program_attached{hook="xdp:<uplink>"} 0); the next
// sync attaches it again, counts it, and it translates again.
func TestXDPReattach(t *testing.T) {
	n := proxytest.NewNode(t, xdpBackend(weftebpf.XDPNative), "a", "b", "c")
	n.Svcs, n.Slices = proxytest.Scenario()
	n.Sync()
	b := n.Backend.(*weftebpf.Backend)
	hook := "xdp:" + proxytest.Uplink
	if v, ok := metricValue(t, b, "weft_ebpf_program_attached", "hook", hook); !ok || v != 1 {
		t.Fatalf("after the first sync: weft_ebpf_program_attached{hook=%s} %v (present %v), want 1", hook, v, ok)
	}
	up, err := netlink.LinkByName(proxytest.Uplink)
	if err != nil {
		t.Fatal(err)
	}
	l, err := link.LoadPinnedLink(filepath.Join(envs[t].pin, fmt.Sprintf("xdp_native_%d", up.Attrs().Index)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.(interface{ Detach() error }).Detach(); err != nil {
		t.Fatal(err)
	}
	_ = l.Close()
	if v, _ := metricValue(t, b, "weft_ebpf_program_attached", "hook", hook); v != 0 {
		t.Fatalf("detached: weft_ebpf_program_attached %v, want 0", v)
	}
	n.Sync()
	if v, _ := metricValue(t, b, "weft_ebpf_program_attached", "hook", hook); v != 1 {
		t.Errorf("after the next sync: weft_ebpf_program_attached %v, want 1", v)
	}
	if v, _ := metricValue(t, b, "weft_ebpf_program_reattached_total", "hook", hook); v != 1 {
		t.Errorf("weft_ebpf_program_reattached_total %v, want 1", v)
	}
	before, _ := b.XDPStats()
	if r, err := n.GetOutside("", "http://"+proxytest.NodeIP+":30081/"); err != nil || r.Pod != "c" {
		t.Fatalf("eTP Local after the next sync: %+v %v", r, err)
	}
	if after, _ := b.XDPStats(); after["translated"] <= before["translated"] {
		t.Fatalf("XDP translated nothing after the next sync (%v, then %v)", before, after)
	}
}
