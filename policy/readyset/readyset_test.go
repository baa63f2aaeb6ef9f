package readyset

import (
	"net/netip"
	"testing"
)

func TestSetName(t *testing.T) {
	for addr, want := range map[string]string{"10.244.1.7": Name4, "::ffff:10.244.1.7": Name4, "fd00::7": Name6} {
		if got := SetName(netip.MustParseAddr(addr)); got != want {
			t.Errorf("SetName(%s) = %s, want %s", addr, got, want)
		}
	}
}

func TestParseSave(t *testing.T) {
	out := "create WEFT-POL-READY hash:ip family inet hashsize 1024 maxelem 1048576 bucketsize 12 initval 0x5d0cfc8d\n" +
		"add WEFT-POL-READY 10.244.1.2\nadd WEFT-POL-READY 10.244.1.3\nadd OTHER 10.0.0.1\n"
	got, err := parseSave([]byte(out), Name4)
	if err != nil || len(got) != 2 || !got[netip.MustParseAddr("10.244.1.2")] || !got[netip.MustParseAddr("10.244.1.3")] {
		t.Fatalf("parseSave = %v, %v", got, err)
	}
	if _, err := parseSave([]byte("add WEFT-POL-READY 10.244.1.300\n"), Name4); err == nil {
		t.Error("a malformed member was accepted")
	}
}
