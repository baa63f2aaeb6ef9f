package iptables_test

import (
	"testing"

	polipt "github.com/weftnet/weft/policy/iptables"
	nt "github.com/weftnet/weft/policy/netpoltest"
)

// bed is the shared kernel bed (netpoltest.Bed: namespaces x and y on
// bridge weft0, bridged traffic, z on weft1, routed) with this backend's
// hook: what apply renders.
type bed struct {
	*nt.Bed
	// checkSources makes apply hold pod traffic to its sources.
	checkSources bool
	// pending makes apply hold pods whose addresses are not ready.
	pending bool
}

const nodeName = nt.BedNode

func newBed(t *testing.T) *bed {
	t.Helper()
	b := &bed{Bed: nt.NewBed(t)}
	t.Cleanup(func() {
		_ = (&polipt.Applier{}).Cleanup()
		_ = (&polipt.Applier{Family: 6}).Cleanup()
	})
	return b
}

// sources are every pod's bridge port and addresses.
func (b *bed) sources() []polipt.Source {
	var out []polipt.Source
	for _, p := range b.Ports {
		out = append(out, polipt.Source{Port: p.Name, Addrs: p.Addrs})
	}
	return out
}
