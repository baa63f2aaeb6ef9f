package netnsutil

import (
	"net"
	"os"
	"testing"

	"github.com/vishvananda/netlink"
)

func TestMain(m *testing.M) { os.Exit(RunTests(m)) }

func requireIsolated(t *testing.T) {
	t.Helper()
	if !Isolated() {
		t.Skip("needs root to run in a private network namespace")
	}
}

// TestIsolated: the test process is not in the host's network namespace.
func TestIsolated(t *testing.T) {
	requireIsolated(t)
	self, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	if host := ParentNetNS(); self == host {
		t.Fatalf("still in the parent's network namespace %s", host)
	}
	links, err := netlink.LinkList()
	if err != nil || len(links) != 1 || links[0].Attrs().Flags&net.FlagUp == 0 {
		t.Fatalf("want only lo, up; got %v (%v)", links, err)
	}
}

func TestNewNamedDoDelete(t *testing.T) {
	requireIsolated(t)
	path, err := NewNamed("nsutil-a")
	if err != nil {
		t.Fatal(err)
	}
	var inside, outside string
	if err := Do(path, func() error {
		inside, err = os.Readlink("/proc/thread-self/ns/net")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	outside, _ = os.Readlink("/proc/self/ns/net")
	if inside == outside {
		t.Fatal("Do did not enter the namespace")
	}
	if _, err := NewNamed("nsutil-a"); err == nil {
		t.Fatal("creating a namespace twice succeeded")
	}
	if err := Delete("nsutil-a"); err != nil {
		t.Fatal(err)
	}
	if err := Delete("nsutil-a"); err != nil {
		t.Fatalf("deleting a missing namespace: %v", err)
	}
	if err := Do(path, func() error { return nil }); err == nil {
		t.Fatal("Do on a deleted namespace succeeded")
	}
}
