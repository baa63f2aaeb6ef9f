package cni_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/weftnet/weft/internal/cnitest"
	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/internal/nlutil"
)

var jsonMarshal = json.Marshal

// TestBadInput runs the plugin as a runtime would with broken input: each
// case must print a spec error naming the problem, exit non-zero, and leave
// nothing in the pod, on the node or in the allocation store.
func TestBadInput(t *testing.T) {
	e := newEnv(t)
	conf := func(mutate func(p map[string]any)) []byte {
		p := e.weft(subnet(podCIDR))
		if mutate != nil {
			mutate(p)
		}
		return pluginConf(t, "1.1.0", "bad", p)
	}
	ranges := func(sub string) func(p map[string]any) {
		return func(p map[string]any) { p["ipam"].(map[string]any)["ranges"] = [][]map[string]any{{{"subnet": sub}}} }
	}
	cases := []struct {
		name     string
		stdin    []byte
		env      func(a *cnitest.Attachment)
		prepare  func(t *testing.T, a cnitest.Attachment)
		wantCode uint
		wantMsg  string
	}{
		{name: "malformed JSON", stdin: []byte(`{"cniVersion":"1.1.0","name":`), wantCode: 6, wantMsg: "network config"},
		{name: "unknown cniVersion", stdin: pluginConf(t, "9.9.9", "bad", e.weft(subnet(podCIDR))), wantCode: 1, wantMsg: "incompatible CNI versions"},
		{name: "missing CNI_NETNS", stdin: conf(nil), env: func(a *cnitest.Attachment) { a.NetNS = "" }, wantCode: 4, wantMsg: "CNI_NETNS"},
		{name: "missing CNI_CONTAINERID", stdin: conf(nil), env: func(a *cnitest.Attachment) { a.ContainerID = "" }, wantCode: 4, wantMsg: "CNI_CONTAINERID"},
		{name: "netns that does not exist", stdin: conf(nil), env: func(a *cnitest.Attachment) { a.NetNS = "/run/netns/no-such-pod" }, wantCode: 8, wantMsg: "CNI_NETNS"},
		{name: "subnet not a CIDR", stdin: conf(ranges("10.244.1.0/33")), wantCode: 7, wantMsg: "ipam.ranges[0][0].subnet"},
		{name: "subnet with host bits", stdin: conf(ranges("10.244.1.7/24")), wantCode: 7, wantMsg: "ipam.ranges[0][0].subnet"},
		{name: "no ranges", stdin: conf(func(p map[string]any) { p["ipam"].(map[string]any)["ranges"] = nil }), wantCode: 7, wantMsg: "ipam.ranges"},
		{name: "bridge name over 15 bytes", stdin: conf(func(p map[string]any) { p["bridge"] = "weft-bridge-0123" }), wantCode: 7, wantMsg: "bridge"},
		{name: "foreign ipam type", stdin: conf(func(p map[string]any) { p["ipam"].(map[string]any)["type"] = "host-local" }), wantCode: 7, wantMsg: "ipam.type"},
		{name: "mtu out of range", stdin: conf(func(p map[string]any) { p["mtu"] = 70000 }), wantCode: 7, wantMsg: "mtu"},
		{
			name: "CNI_IFNAME already in the pod", stdin: conf(nil), wantCode: 4, wantMsg: "CNI_IFNAME",
			prepare: func(t *testing.T, a cnitest.Attachment) {
				err := netnsutil.Do(a.NetNS, func() error {
					return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: a.IfName}, PeerName: "other0"})
				})
				if err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			// Fails after the veth exists: the pod cannot reach the route's gateway.
			name: "unreachable route gateway", wantCode: 999, wantMsg: "adding route",
			stdin: conf(func(p map[string]any) {
				p["ipam"].(map[string]any)["routes"] = []map[string]any{{"dst": "192.0.2.0/24", "gw": "198.51.100.1"}}
			}),
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := e.pod()
			if tc.prepare != nil {
				tc.prepare(t, a)
			}
			before := podLinks(t, a.NetNS)
			nodeBefore := nodeLinks(t, e.bridge)
			if tc.env != nil {
				tc.env(&a)
			}
			cmd, out := runPlugin(t, e, "ADD", a, tc.stdin)
			if err := cmd.Wait(); err == nil {
				t.Fatalf("plugin exited 0 on bad input; stdout: %s", out)
			}
			var got struct {
				Code    uint   `json:"code"`
				Msg     string `json:"msg"`
				Details string `json:"details"`
			}
			if err := json.Unmarshal(out.Bytes(), &got); err != nil {
				t.Fatalf("stdout is not a spec error: %v: %q", err, out)
			}
			if got.Code != tc.wantCode || !strings.Contains(got.Msg+" "+got.Details, tc.wantMsg) {
				t.Fatalf("got code %d msg %q details %q; want code %d mentioning %q", got.Code, got.Msg, got.Details, tc.wantCode, tc.wantMsg)
			}
			if tc.env == nil {
				if after := podLinks(t, a.NetNS); !slices.Equal(before, after) {
					t.Fatalf("pod links changed: %v -> %v", before, after)
				}
			}
			if after := nodeLinks(t, e.bridge); !slices.Equal(nodeBefore, after) {
				t.Fatalf("node links changed: %v -> %v", nodeBefore, after)
			}
			if k := e.allocations("bad"); len(k) != 0 {
				t.Fatalf("allocations left: %v", k)
			}
		})
	}
}

// nodeLinks lists the node's links, leaving out the bridge itself: the
// bridge is node infrastructure that an ADD may create before it fails.
func nodeLinks(t *testing.T, bridge string) []string {
	t.Helper()
	links, err := nlutil.Dump("links", netlink.LinkList)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range links {
		if l.Attrs().Name != bridge {
			names = append(names, l.Attrs().Name)
		}
	}
	slices.Sort(names)
	return names
}
