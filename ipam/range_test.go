package ipam_test

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/weftnet/weft/ipam"
)

var (
	pfx  = netip.MustParsePrefix
	addr = netip.MustParseAddr
)

// rng builds a Range from strings; empty strings leave fields unset.
func rng(subnet, start, end, gw string) ipam.Range {
	r := ipam.Range{Subnet: pfx(subnet)}
	if start != "" {
		r.RangeStart = addr(start)
	}
	if end != "" {
		r.RangeEnd = addr(end)
	}
	if gw != "" {
		r.Gateway = addr(gw)
	}
	return r
}

func sub(subnet string) ipam.Range { return ipam.Range{Subnet: pfx(subnet)} }

func TestNewPoolInvalid(t *testing.T) {
	tests := []struct {
		name string
		sets []ipam.RangeSet
		want []string // substrings of the error
	}{
		{"no sets", nil, []string{"ipam.ranges: empty"}},
		{"empty set", []ipam.RangeSet{{sub("10.0.0.0/24")}, {}}, []string{"ipam.ranges[1]: empty"}},
		{"missing subnet", []ipam.RangeSet{{ipam.Range{}}}, []string{"ipam.ranges[0][0].subnet: required"}},
		{"not masked", []ipam.RangeSet{{sub("10.244.0.0/24"), sub("10.244.1.5/24")}},
			[]string{"ipam.ranges[0][1].subnet: 10.244.1.5/24 is not a network address"}},
		{"v4 /32", []ipam.RangeSet{{sub("10.0.0.1/32")}}, []string{"ipam.ranges[0][0].subnet:", "too small"}},
		{"v4 /31", []ipam.RangeSet{{sub("10.0.0.0/31")}}, []string{"ipam.ranges[0][0].subnet:", "too small"}},
		{"v6 /128", []ipam.RangeSet{{sub("fd00::1/128")}}, []string{"ipam.ranges[0][0].subnet:", "too small"}},
		{"v6 /127 only gateway", []ipam.RangeSet{{sub("fd00::/127")}}, []string{"ipam.ranges[0][0]: no usable address"}},
		{"start outside", []ipam.RangeSet{{sub("10.0.0.0/24")}, {rng("10.2.0.0/16", "10.1.0.1", "", "")}},
			[]string{"ipam.ranges[1][0].rangeStart: 10.1.0.1 is outside subnet 10.2.0.0/16"}},
		{"end outside", []ipam.RangeSet{{rng("10.2.0.0/16", "", "10.3.0.1", "")}},
			[]string{"ipam.ranges[0][0].rangeEnd: 10.3.0.1 is outside subnet 10.2.0.0/16"}},
		{"start wrong family", []ipam.RangeSet{{rng("10.2.0.0/16", "fd00::1", "", "")}},
			[]string{"ipam.ranges[0][0].rangeStart: fd00::1 is outside subnet"}},
		{"start after end", []ipam.RangeSet{{rng("10.0.0.0/24", "10.0.0.50", "10.0.0.10", "")}},
			[]string{"ipam.ranges[0][0].rangeStart: 10.0.0.50 is after rangeEnd 10.0.0.10"}},
		{"gateway outside", []ipam.RangeSet{{rng("10.0.0.0/24", "", "", "10.0.1.1")}},
			[]string{"ipam.ranges[0][0].gateway: 10.0.1.1 is outside subnet 10.0.0.0/24"}},
		{"gateway is network", []ipam.RangeSet{{rng("10.0.0.0/24", "", "", "10.0.0.0")}},
			[]string{"ipam.ranges[0][0].gateway:", "network address"}},
		{"gateway is broadcast", []ipam.RangeSet{{rng("10.0.0.0/24", "", "", "10.0.0.255")}},
			[]string{"ipam.ranges[0][0].gateway:", "broadcast address"}},
		{"zoned gateway", []ipam.RangeSet{{rng("fe80::/64", "", "", "fe80::1%eth0")}},
			[]string{"ipam.ranges[0][0].gateway:", "zone"}},
		{"mixed families", []ipam.RangeSet{{sub("10.0.0.0/24"), sub("fd00::/64")}},
			[]string{"ipam.ranges[0]: mixes IPv4 and IPv6"}},
		{"mixed families second set", []ipam.RangeSet{{sub("fd01::/64")}, {sub("fd00::/64"), sub("10.0.0.0/24")}},
			[]string{"ipam.ranges[1]: mixes IPv4 and IPv6"}},
		{"overlap in set", []ipam.RangeSet{{sub("10.244.0.0/16"), sub("10.244.1.0/24")}},
			[]string{"ipam.ranges[0][1].subnet: overlaps ipam.ranges[0][0].subnet"}},
		{"same subnet twice", []ipam.RangeSet{{sub("10.244.1.0/24"), sub("10.244.1.0/24")}},
			[]string{"ipam.ranges[0][1].subnet: overlaps ipam.ranges[0][0].subnet"}},
		{"overlap across sets", []ipam.RangeSet{{sub("10.244.1.0/24")}, {sub("fd00::/64")}, {sub("10.244.0.0/23")}},
			[]string{"ipam.ranges[2][0].subnet: overlaps ipam.ranges[0][0].subnet"}},
		{"overlapping explicit ranges", []ipam.RangeSet{{
			rng("10.0.0.0/24", "10.0.0.2", "10.0.0.100", ""),
			rng("10.0.0.0/24", "10.0.0.100", "10.0.0.200", ""),
		}}, []string{"ipam.ranges[0][1]: range 10.0.0.100-10.0.0.200 overlaps ipam.ranges[0][0]"}},
		{"single address is gateway", []ipam.RangeSet{{rng("10.0.0.0/24", "10.0.0.1", "10.0.0.1", "")}},
			[]string{"ipam.ranges[0][0]: no usable address"}},
		{"only another range's gateway", []ipam.RangeSet{{
			rng("10.0.0.0/24", "10.0.0.2", "10.0.0.100", "10.0.0.150"),
			rng("10.0.0.0/24", "10.0.0.150", "10.0.0.150", ""),
		}}, []string{"ipam.ranges[0][1]: no usable address"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := ipam.NewPool(tt.sets)
			if err == nil {
				t.Fatalf("NewPool succeeded (%v), want error containing %q", p.Sets(), tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestNewPoolDefaults(t *testing.T) {
	tests := []struct {
		name string
		in   []ipam.RangeSet
		want []ipam.RangeSet
	}{
		{"v4", []ipam.RangeSet{{sub("10.244.1.0/24")}},
			[]ipam.RangeSet{{rng("10.244.1.0/24", "10.244.1.1", "10.244.1.254", "10.244.1.1")}}},
		{"v4 /30", []ipam.RangeSet{{sub("10.0.0.4/30")}},
			[]ipam.RangeSet{{rng("10.0.0.4/30", "10.0.0.5", "10.0.0.6", "10.0.0.5")}}},
		{"v6", []ipam.RangeSet{{sub("fd00:10:244:1::/64")}},
			[]ipam.RangeSet{{rng("fd00:10:244:1::/64", "fd00:10:244:1::1", "fd00:10:244:1:ffff:ffff:ffff:ffff", "fd00:10:244:1::1")}}},
		{"explicit kept", []ipam.RangeSet{{rng("10.0.0.0/16", "10.0.5.0", "10.0.5.255", "10.0.0.254")}},
			[]ipam.RangeSet{{rng("10.0.0.0/16", "10.0.5.0", "10.0.5.255", "10.0.0.254")}}},
		{"dual stack and split subnet", []ipam.RangeSet{
			{rng("10.0.0.0/24", "", "10.0.0.100", ""), rng("10.0.0.0/24", "10.0.0.101", "", "")},
			{sub("fd00::/120")},
			{sub("10.1.0.0/24")}, // a second IPv4 set is allowed
		}, []ipam.RangeSet{
			{rng("10.0.0.0/24", "10.0.0.1", "10.0.0.100", "10.0.0.1"), rng("10.0.0.0/24", "10.0.0.101", "10.0.0.254", "10.0.0.1")},
			{rng("fd00::/120", "fd00::1", "fd00::ff", "fd00::1")},
			{rng("10.1.0.0/24", "10.1.0.1", "10.1.0.254", "10.1.0.1")},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := ipam.NewPool(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			got := p.Sets()
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Sets() = %v, want %v", got, tt.want)
			}
			got[0][0].Gateway = addr("192.0.2.1") // Sets returns a copy
			if reflect.DeepEqual(p.Sets(), got) {
				t.Error("modifying Sets() result changed the pool")
			}
		})
	}
}
