package readyset

import (
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/weftnet/weft/internal/netnsutil"
)

func TestMain(m *testing.M) { os.Exit(netnsutil.RunTests(m)) }

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestRevokeKernel revokes through both backends' sets at once: present
// addresses of both families leave the ipsets and the nftables sets, other
// members stay, and absent addresses, absent sets or no sets at all are no
// error.
func TestRevokeKernel(t *testing.T) {
	if !netnsutil.Isolated() {
		t.Skip("needs root (a private network namespace)")
	}
	revoke := []netip.Addr{netip.MustParseAddr("10.244.0.7"), netip.MustParseAddr("fd00::7"), netip.MustParseAddr("10.244.0.9")}
	// No set of either backend exists yet.
	if err := Revoke(revoke); err != nil {
		t.Fatalf("Revoke without sets: %v", err)
	}
	run(t, "ipset", "create", Name4, "hash:ip")
	run(t, "ipset", "create", Name6, "hash:ip", "family", "inet6")
	run(t, "ipset", "add", Name4, "10.244.0.7")
	run(t, "ipset", "add", Name4, "10.244.0.8")
	run(t, "ipset", "add", Name6, "fd00::7")
	run(t, "nft", "add table inet "+NFTTable+
		"; add set inet "+NFTTable+" "+NFTSet4+" { type ipv4_addr; elements = { 10.244.0.7, 10.244.0.8 }; }"+
		"; add set inet "+NFTTable+" "+NFTSet6+" { type ipv6_addr; elements = { fd00::7, fd00::8 }; }")

	r, err := OpenRevoker()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for range 2 { // the second time every address is absent
		if err := r.Revoke(revoke); err != nil {
			t.Fatalf("Revoke: %v", err)
		}
	}
	for name, want := range map[string]string{Name4: "10.244.0.8", Name6: ""} {
		got, err := Members(name)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(strings.Fields(want)) || (want != "" && !got[netip.MustParseAddr(want)]) {
			t.Errorf("ipset %s holds %v, want [%s]", name, got, want)
		}
	}
	for set, want := range map[string]string{NFTSet4: "10.244.0.8", NFTSet6: "fd00::8"} {
		out := run(t, "nft", "list", "set", "inet", NFTTable, set)
		if !strings.Contains(out, want) || strings.Contains(out, "::7") || strings.Contains(out, ".7") {
			t.Errorf("nft set %s after Revoke:\n%s\nwant only %s", set, out, want)
		}
	}
}
