package ebpf_test

import (
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

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
