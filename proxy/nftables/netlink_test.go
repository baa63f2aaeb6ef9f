package nftables

import (
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestElementBatchIsOneTransaction: a batch the kernel refuses in part
// changes nothing, and the error names the set and the kernel's reason.
func TestElementBatchIsOneTransaction(t *testing.T) {
	const table = "weft-batch-test"
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("nft", args...).Output()
		if err != nil {
			t.Fatalf("nft %v: %v", args, err)
		}
		return string(out)
	}
	run("add", "table", "inet", table)
	t.Cleanup(func() { _ = exec.Command("nft", "delete", "table", "inet", table).Run() })
	run("add", "map", "inet", table, "m", "{ typeof ip daddr . meta l4proto . th dport : ip daddr . th dport ; }")
	m := &Set{Name: "m", Value: "ip daddr . th dport", keyFields: []field{fieldAddr, fieldProto, fieldPort},
		valueFields: []field{fieldAddr, fieldPort}}
	w := netlinkElements{table: table}
	op := func(verb elemVerb, key, value []string) elemOp {
		t.Helper()
		k, err := encode(nil, m.keyFields, key)
		if err != nil {
			t.Fatal(err)
		}
		if value == nil {
			return elemOp{verb: verb, set: m, key: toPacked(k)}
		}
		v, err := encode(nil, m.valueFields, value)
		if err != nil {
			t.Fatal(err)
		}
		return elemOp{verb: verb, set: m, key: toPacked(k), value: toValue(v)}
	}
	add := op(elemAdd, []string{"10.96.0.1", "tcp", "80"}, []string{"10.244.0.1", "8080"})
	if err := w.write([]elemOp{add}); err != nil {
		t.Fatal(err)
	}
	if out := run("list", "map", "inet", table, "m"); !strings.Contains(out, "10.96.0.1 . tcp . 80 : 10.244.0.1 . 8080") {
		t.Fatalf("the element is not in the map:\n%s", out)
	}
	second := op(elemAdd, []string{"10.96.0.2", "udp", "53"}, []string{"10.244.0.2", "53"})
	missing := op(elemDelete, []string{"10.96.0.9", "tcp", "80"}, nil)
	err := w.write([]elemOp{{verb: elemDelete, set: m, key: add.key}, second, missing})
	if !errors.Is(err, unix.ENOENT) || !strings.Contains(err.Error(), "set m") {
		t.Fatalf("got %v, want ENOENT naming set m", err)
	}
	out := run("list", "map", "inet", table, "m")
	if !strings.Contains(out, "10.96.0.1 . tcp . 80") || strings.Contains(out, "10.96.0.2") {
		t.Fatalf("a refused batch changed the map:\n%s", out)
	}
}

// TestPackedParts: every kind of part, of both families, packs and prints
// back as nft prints it; a part that does not parse is an error naming it.
func TestPackedParts(t *testing.T) {
	lb := []field{fieldAddr, fieldProto, fieldPort, fieldInt}
	allow := []field{fieldAddr, fieldProto, fieldPort, fieldPrefix}
	for _, c := range []struct {
		fam    int
		fields []field
		parts  []string
	}{
		{4, lb, []string{"10.96.0.1", "sctp", "65535", "4294967295"}},
		{6, lb, []string{"fd00:96::1", "udp", "53", "0"}},
		{4, allow, []string{"10.96.0.1", "tcp", "80", "192.0.2.0/24"}},
		{6, allow, []string{"fd00:96::1", "tcp", "443", "2001:db8::/32"}},
	} {
		b, err := encode(nil, c.fields, c.parts)
		if err != nil {
			t.Fatal(err)
		}
		s := &Set{keyFields: c.fields, family: c.fam}
		if got := s.keyParts(toPacked(b)); !slices.Equal(got, c.parts) {
			t.Errorf("IPv%d: %v packs and prints back as %v", c.fam, c.parts, got)
		}
	}
	if _, err := encode(nil, []field{fieldAddr, fieldProto}, []string{"10.96.0.1", "icmp"}); err == nil || !strings.Contains(err.Error(), "icmp") {
		t.Errorf("an unknown protocol: got %v, want an error naming it", err)
	}
}
