package routing_test

import (
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/weftnet/weft/routing"
)

// applyConfig computes node i's state under cfg (edited from v's) and
// applies it, returning Apply's error.
func (l *lab) applyConfig(i int, cfg routing.Config) error {
	l.t.Helper()
	d, errs := routing.Compute(cfg, l.members())
	if len(errs) > 0 {
		l.t.Fatalf("node-%d: Compute: %v", i, errs)
	}
	var err error
	l.do(l.node(i).ns, func() error { err = l.node(i).rec.Apply(d); return nil })
	return err
}

// TestVXLANDeviceRecreated: a device whose VNI (or port) differs cannot be
// changed in place: it is recreated, and traffic flows on the new VNI.
func TestVXLANDeviceRecreated(t *testing.T) {
	v := variants[1]
	l := newLab(t, 3)
	l.serve()
	l.applyAll(v)
	old := l.state(1).dev
	for _, nd := range l.nodes {
		cfg := v.config(nd.i)
		cfg.VXLAN.VNI, cfg.VXLAN.Port = 7, 4789
		if err := l.applyConfig(nd.i, cfg); err != nil {
			t.Fatal(err)
		}
	}
	dev := l.state(1).dev
	if dev == nil || dev.VxlanId != 7 || dev.Port != 4789 || dev.Index == old.Index {
		t.Fatalf("device after the VNI change: %+v (old index %d)", dev, old.Index)
	}
	l.mustReach(1, 2, 3)
}

// TestVXLANExplicitMTU: a configured MTU is used as is, and a renamed
// device replaces the old one (found by weft's alias, not by name).
func TestVXLANExplicitMTU(t *testing.T) {
	v := variants[1]
	l := newLab(t, 3)
	l.serve()
	l.applyAll(v)
	for _, nd := range l.nodes {
		cfg := v.config(nd.i)
		cfg.VXLAN.Device, cfg.VXLAN.MTU = "weft.vx2", 1300
		if err := l.applyConfig(nd.i, cfg); err != nil {
			t.Fatal(err)
		}
	}
	dev := l.state(1).dev // state fails the test if two weft devices exist
	if dev == nil || dev.Name != "weft.vx2" || dev.MTU != 1300 {
		t.Fatalf("device %+v, want weft.vx2 with MTU 1300", dev)
	}
	l.mustReach(1, 2, 3)
}

// TestVXLANNameTaken: a link with the device's name that is not a VXLAN
// device is not weft's: Apply reports it, leaves it alone, puts no route on
// it, and still deletes stale state.
func TestVXLANNameTaken(t *testing.T) {
	v := variants[1]
	l := newLab(t, 3)
	l.do(l.node(1).ns, func() error { return addBridge(routing.DefaultDevice) })
	err := l.applyConfig(1, v.config(1))
	if err == nil || !strings.Contains(err.Error(), "vxlan device "+routing.DefaultDevice) {
		t.Fatalf("Apply with a bridge named %s: %v", routing.DefaultDevice, err)
	}
	l.do(l.node(1).ns, func() error {
		link, err := netlink.LinkByName(routing.DefaultDevice)
		if err != nil || link.Type() != "bridge" {
			t.Errorf("the bridge: %v (%v)", link, err)
		}
		return nil
	})
	if s := l.state(1); len(s.routes) != 0 || s.dev != nil {
		t.Fatalf("routes %v, device %v: want none", s.routes, s.dev)
	}
}
