package agent

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/weftnet/weft/cni"
	"github.com/weftnet/weft/ipam"
)

// The source check's pairs are the plugin's allocations: each key's host
// veth with its addresses, both families.
func TestPodSources(t *testing.T) {
	dataDir := t.TempDir()
	if got, err := podAllocations(dataDir); err != nil || len(got) != 0 {
		t.Fatalf("no allocations yet: %v, %v", got, err)
	}
	dir, err := ipam.NetworkDir(dataDir, CNINetwork)
	if err != nil {
		t.Fatal(err)
	}
	store, err := ipam.NewDiskStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	a4, a6 := netip.MustParseAddr("10.244.1.7"), netip.MustParseAddr("fd00::7")
	key := ipam.Key{ContainerID: "c1", IfName: "eth0"}
	if err := store.Update(func(st *ipam.State) error {
		st.Allocations = append(st.Allocations, ipam.Allocation{Key: key, Addresses: []netip.Addr{a4, a6}})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	allocs, err := podAllocations(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	got := podSources(allocs)
	want := []podSource{{Port: cni.HostVethName("c1", "eth0"), Addrs: []netip.Addr{a4, a6}}}
	if len(got) != 1 || got[0].Port != want[0].Port || !slices.Equal(got[0].Addrs, want[0].Addrs) {
		t.Fatalf("sources %+v, want %+v", got, want)
	}
}
