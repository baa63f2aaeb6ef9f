package cni

import (
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/weftnet/weft/internal/netnsutil"
)

// TestWatchDeletions: the reaper's raw subscription announces the deletion
// of the link it is asked about, not of another, and stopping it ends its
// reader (which reports the subscription broken).
func TestWatchDeletions(t *testing.T) {
	if !netnsutil.Isolated() {
		t.Skip("kernel test: needs root to run in a private network namespace")
	}
	stopped := make(chan struct{})
	d, err := watchDeletions(func() { close(stopped) })
	if err != nil {
		t.Fatal(err)
	}
	veth := func(name string) int {
		t.Helper()
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
			t.Fatal(err)
		}
		l, err := netlink.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		return l.Attrs().Index
	}
	gone, stays := veth("wdgone"), veth("wdstays")
	goneCh, staysCh := d.watch(gone), d.watch(stays)
	l, _ := netlink.LinkByIndex(gone)
	if err := netlink.LinkDel(l); err != nil {
		t.Fatal(err)
	}
	select {
	case <-goneCh:
	case <-time.After(30 * time.Second):
		t.Fatal("no announcement of the deleted link")
	}
	select {
	case <-staysCh:
		t.Fatal("a link that still exists was announced deleted")
	default:
	}
	d.stop()
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("the subscription's reader did not end after stop")
	}
}
