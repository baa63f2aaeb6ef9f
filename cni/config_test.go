package cni

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

func confJSON(t *testing.T, mutate func(m map[string]any)) []byte {
	t.Helper()
	m := map[string]any{
		"cniVersion": "1.1.0", "name": "pods", "type": "weft", "bridge": "weft0", "mtu": 1450,
		"ipam": map[string]any{"ranges": [][]map[string]any{{{"subnet": "10.244.1.0/24"}}}, "dataDir": "/var/lib/weft/ipam"},
	}
	if mutate != nil {
		mutate(m)
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func ipamOf(m map[string]any) map[string]any { return m["ipam"].(map[string]any) }

func TestParseConfigValid(t *testing.T) {
	cfg, err := ParseConfig(confJSON(t, func(m map[string]any) {
		delete(m, "bridge")
		delete(m, "mtu")
		delete(ipamOf(m), "dataDir")
		ipamOf(m)["ranges"] = [][]map[string]any{
			{{"subnet": "10.244.1.0/24", "rangeStart": "10.244.1.10", "rangeEnd": "10.244.1.20"}},
			{{"subnet": "fd00:10:244:1::/64"}},
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Bridge != DefaultBridge || cfg.MTU != 0 || cfg.IPAM.DataDir != DefaultDataDir || !cfg.Hairpin {
		t.Fatalf("defaults not applied: bridge %q mtu %d dataDir %q hairpin %v", cfg.Bridge, cfg.MTU, cfg.IPAM.DataDir, cfg.Hairpin)
	}
	sets := cfg.Pool.Sets()
	if len(sets) != 2 || sets[0][0].RangeStart.String() != "10.244.1.10" || sets[1][0].Gateway.String() != "fd00:10:244:1::1" {
		t.Fatalf("range sets: %+v", sets)
	}

	off := false
	cfg, err = ParseConfig(confJSON(t, func(m map[string]any) { m["hairpinMode"] = off; ipamOf(m)["type"] = "weft" }))
	if err != nil || cfg.Hairpin {
		t.Fatalf("hairpinMode false / ipam.type weft: cfg %+v err %v", cfg, err)
	}
}

func TestParseConfigInvalid(t *testing.T) {
	cases := []struct {
		name     string
		raw      []byte
		mutate   func(m map[string]any)
		wantCode uint
		wantMsg  string
	}{
		{name: "not JSON", raw: []byte(`{"name":`), wantCode: types.ErrDecodingFailure, wantMsg: "decoding"},
		{name: "wrong type for mtu", mutate: func(m map[string]any) { m["mtu"] = "big" }, wantCode: types.ErrDecodingFailure, wantMsg: "decoding"},
		{name: "no name", mutate: func(m map[string]any) { delete(m, "name") }, wantCode: types.ErrInvalidNetworkConfig, wantMsg: "name:"},
		{name: "network name with a slash", mutate: func(m map[string]any) { m["name"] = "../etc" }, wantCode: 0, wantMsg: ""},
		{name: "bridge name 16 bytes", mutate: func(m map[string]any) { m["bridge"] = "0123456789abcdef" }, wantCode: types.ErrInvalidNetworkConfig, wantMsg: "bridge:"},
		{name: "bridge name with a slash", mutate: func(m map[string]any) { m["bridge"] = "br/0" }, wantCode: types.ErrInvalidNetworkConfig, wantMsg: "bridge:"},
		{name: "mtu too small", mutate: func(m map[string]any) { m["mtu"] = 100 }, wantCode: types.ErrInvalidNetworkConfig, wantMsg: "mtu:"},
		{name: "mtu negative", mutate: func(m map[string]any) { m["mtu"] = -1 }, wantCode: types.ErrInvalidNetworkConfig, wantMsg: "mtu:"},
		{name: "foreign ipam type", mutate: func(m map[string]any) { ipamOf(m)["type"] = "host-local" }, wantCode: types.ErrInvalidNetworkConfig, wantMsg: "ipam.type:"},
		{name: "no ranges", mutate: func(m map[string]any) { delete(ipamOf(m), "ranges") }, wantCode: types.ErrInvalidNetworkConfig, wantMsg: "ipam.ranges"},
		{name: "empty range set", mutate: func(m map[string]any) { ipamOf(m)["ranges"] = [][]map[string]any{{}} }, wantCode: types.ErrInvalidNetworkConfig, wantMsg: "ipam.ranges[0]"},
		{name: "missing subnet", mutate: func(m map[string]any) { ipamOf(m)["ranges"] = [][]map[string]any{{{"gateway": "10.0.0.1"}}} }, wantCode: types.ErrInvalidNetworkConfig, wantMsg: "ipam.ranges[0][0].subnet: missing"},
		{name: "subnet not a CIDR", mutate: func(m map[string]any) { ipamOf(m)["ranges"] = [][]map[string]any{{{"subnet": "10.244.1.0"}}} }, wantCode: types.ErrInvalidNetworkConfig, wantMsg: "ipam.ranges[0][0].subnet"},
		{name: "prefix too long", mutate: func(m map[string]any) { ipamOf(m)["ranges"] = [][]map[string]any{{{"subnet": "10.244.1.0/33"}}} }, wantCode: types.ErrInvalidNetworkConfig, wantMsg: "ipam.ranges[0][0].subnet"},
		{name: "host bits set", mutate: func(m map[string]any) { ipamOf(m)["ranges"] = [][]map[string]any{{{"subnet": "10.244.1.9/24"}}} }, wantCode: types.ErrInvalidNetworkConfig, wantMsg: "ipam.ranges[0][0].subnet"},
		{name: "rangeStart not an IP", mutate: func(m map[string]any) {
			ipamOf(m)["ranges"] = [][]map[string]any{{{"subnet": "10.244.1.0/24", "rangeStart": "ten"}}}
		}, wantCode: types.ErrInvalidNetworkConfig, wantMsg: "ipam.ranges[0][0].rangeStart"},
		{name: "gateway outside subnet", mutate: func(m map[string]any) {
			ipamOf(m)["ranges"] = [][]map[string]any{{{"subnet": "10.244.1.0/24", "gateway": "10.9.9.9"}}}
		}, wantCode: types.ErrInvalidNetworkConfig, wantMsg: "ipam.ranges[0][0].gateway"},
		{name: "families mixed in a set", mutate: func(m map[string]any) {
			ipamOf(m)["ranges"] = [][]map[string]any{{{"subnet": "10.244.1.0/24"}, {"subnet": "fd00::/64"}}}
		}, wantCode: types.ErrInvalidNetworkConfig, wantMsg: "ipam.ranges[0]"},
		{name: "overlapping sets", mutate: func(m map[string]any) {
			ipamOf(m)["ranges"] = [][]map[string]any{{{"subnet": "10.244.0.0/16"}}, {{"subnet": "10.244.1.0/24"}}}
		}, wantCode: types.ErrInvalidNetworkConfig, wantMsg: "overlaps"},
		{name: "route without dst", mutate: func(m map[string]any) { ipamOf(m)["routes"] = []map[string]any{{"gw": "10.244.1.1"}} }, wantCode: types.ErrInvalidNetworkConfig, wantMsg: "ipam.routes[0].dst"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			raw := tc.raw
			if raw == nil {
				raw = confJSON(t, tc.mutate)
			}
			cfg, err := ParseConfig(raw)
			if tc.wantCode == 0 {
				// Accepted at parse time; the store refuses the name.
				if err != nil {
					t.Fatalf("ParseConfig: %v", err)
				}
				_, err = openStore(cfg)
				if err == nil || !strings.Contains(err.Error(), "name") {
					t.Fatalf("openStore with network name %q: %v", cfg.Name, err)
				}
				return
			}
			var te *types.Error
			if !errors.As(err, &te) {
				t.Fatalf("got %v (%T), want a *types.Error", err, err)
			}
			if te.Code != tc.wantCode || !strings.Contains(te.Msg, tc.wantMsg) {
				t.Fatalf("got code %d msg %q (details %q); want code %d with %q", te.Code, te.Msg, te.Details, tc.wantCode, tc.wantMsg)
			}
		})
	}
}

func TestHostVethName(t *testing.T) {
	a := HostVethName("0123456789abcdef", "eth0")
	if len(a) != maxIfNameLen || !isHostVethName(a) {
		t.Fatalf("%q is not a valid host veth name", a)
	}
	if a != HostVethName("0123456789abcdef", "eth0") {
		t.Fatal("not deterministic")
	}
	if a == HostVethName("0123456789abcdef", "eth1") || a == HostVethName("0123456789abcdee", "eth0") {
		t.Fatal("different attachments share a name")
	}
	for _, name := range []string{"weft0", "eth0", "weftXYZ01234567", "veth0123456789a"} {
		if isHostVethName(name) {
			t.Fatalf("%q taken for a weft host veth", name)
		}
	}
}
