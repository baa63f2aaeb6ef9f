package sysctl

import (
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/netnsutil"
)

func TestMain(m *testing.M) { os.Exit(netnsutil.RunTests(m)) }

func TestPath(t *testing.T) {
	for name, want := range map[string]string{
		"net.ipv4.ip_forward":                "/proc/sys/net/ipv4/ip_forward",
		"net/ipv4/conf/eth0.10/rp_filter":    "/proc/sys/net/ipv4/conf/eth0.10/rp_filter",
		"net.bridge.bridge-nf-call-iptables": "/proc/sys/net/bridge/bridge-nf-call-iptables",
	} {
		if got := Path(name); got != want {
			t.Errorf("Path(%q) = %s, want %s", name, got, want)
		}
	}
}

// TestEnsure sets a network namespace's setting for real, then finds it
// set with /proc/sys read-only (as in a container that is not
// privileged), and names the setting it cannot set or does not find.
func TestEnsure(t *testing.T) {
	if !netnsutil.Isolated() {
		t.Skip("needs root: writes the settings of a private network namespace")
	}
	const name = "net.ipv4.ip_forward"
	read := func() string {
		b, err := os.ReadFile(Path(name))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	if got := read(); got != "0" {
		t.Fatalf("%s of a fresh network namespace is %s", name, got)
	}
	if err := Ensure(name, "1"); err != nil {
		t.Fatal(err)
	}
	if got := read(); got != "1" {
		t.Fatalf("%s is %s after Ensure(1)", name, got)
	}
	// /proc/sys read-only in this test's own mount namespace.
	if err := unix.Mount("/proc/sys", "/proc/sys", "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount("/proc/sys", unix.MNT_DETACH)
	if err := unix.Mount("", "/proc/sys", "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	if err := Ensure(name, "1"); err != nil {
		t.Errorf("a setting already made needs no write: %v", err)
	}
	err := Ensure(name, "0")
	if want := "sysctl net.ipv4.ip_forward is 1 and cannot be set to 0 (/proc/sys is read-only here"; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error %v, want %s...", err, want)
	}
	err = Ensure("net.weft.nothing", "1")
	if want := "sysctl net.weft.nothing: not in this kernel"; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error %v, want %s...", err, want)
	}
}
