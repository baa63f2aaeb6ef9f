package lab

import (
	"strings"
	"testing"
)

func TestResolveDataplane(t *testing.T) {
	for _, tc := range []struct {
		proxy, dataplane         string
		wantProxy, wantDataplane string
		err                      string // a substring of the error, "" for none
	}{
		{"", "", "iptables", "iptables", ""},
		{"", "nftables", "nftables", "nftables", ""},
		{"nftables", "", "nftables", "nftables", ""},
		{"ebpf", "", "ebpf", "iptables", ""},
		{"iptables", "iptables", "iptables", "iptables", ""},
		{"nftables", "nftables", "nftables", "nftables", ""},
		{"nftables", "iptables", "", "", "--dataplane iptables with --proxy-mode nftables"},
		{"ebpf", "nftables", "", "", "--dataplane nftables with --proxy-mode ebpf"},
		{"iptables", "nftables", "", "", "--dataplane nftables with --proxy-mode iptables"},
		{"", "bpf", "", "", `--dataplane: "bpf" is not one of`},
		{"ipvs", "", "", "", `--proxy-mode: "ipvs" is not one of`},
	} {
		o := Options{ProxyMode: tc.proxy, Dataplane: tc.dataplane}
		err := resolveDataplane(&o)
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("proxy %q dataplane %q: error %v, want one containing %q", tc.proxy, tc.dataplane, err, tc.err)
			}
		case err != nil:
			t.Errorf("proxy %q dataplane %q: %v", tc.proxy, tc.dataplane, err)
		case o.ProxyMode != tc.wantProxy || o.Dataplane != tc.wantDataplane:
			t.Errorf("proxy %q dataplane %q: got %q/%q, want %q/%q", tc.proxy, tc.dataplane, o.ProxyMode, o.Dataplane, tc.wantProxy, tc.wantDataplane)
		}
	}
}
