package cni

import (
	"bytes"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
)

// TestDispatch: the plugin's entry point reads the environment and stdin as
// the specification says and answers like the reference skeleton: the same
// error codes, VERSION, and the about text for a person.
func TestDispatch(t *testing.T) {
	conf := func(version string) string { return `{"cniVersion":"` + version + `","name":"n","type":"weft"}` }
	full := map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/proc/1/ns/net", "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range full {
			m[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	cases := []struct {
		name     string
		env      map[string]string
		stdin    string
		wantCode uint // 0: success
		wantMsg  string
		wantOut  string
		wantErr  string // stderr
		wantArgs *CmdArgs
	}{
		{name: "ADD", env: with("CNI_ARGS", "K8S_POD_NAME=p"), stdin: conf("1.1.0"),
			wantArgs: &CmdArgs{ContainerID: "c1", Netns: "/proc/1/ns/net", IfName: "eth0", Args: "K8S_POD_NAME=p", Path: "/opt/cni/bin", StdinData: []byte(conf("1.1.0"))}},
		{name: "DEL needs no netns", env: with("CNI_COMMAND", "DEL", "CNI_NETNS", ""), stdin: conf("0.4.0"),
			wantArgs: &CmdArgs{ContainerID: "c1", IfName: "eth0", Path: "/opt/cni/bin", StdinData: []byte(conf("0.4.0"))}},
		{name: "about", env: map[string]string{}, wantErr: "weft test\nCNI protocol versions supported: 0.4.0, 1.0.0, 1.1.0\n"},
		{name: "VERSION", env: map[string]string{"CNI_COMMAND": "VERSION"}, wantOut: `{"cniVersion":"1.1.0","supportedVersions":["0.4.0","1.0.0","1.1.0"]}` + "\n"},
		{name: "missing netns", env: with("CNI_NETNS", ""), stdin: conf("1.1.0"), wantCode: types.ErrInvalidEnvironmentVariables, wantMsg: "[CNI_NETNS]"},
		{name: "missing two", env: with("CNI_PATH", ""), stdin: conf("1.1.0"), wantCode: types.ErrInvalidEnvironmentVariables, wantMsg: "CNI_PATH"},
		{name: "bad container ID", env: with("CNI_CONTAINERID", "-x/y"), stdin: conf("1.1.0"), wantCode: types.ErrInvalidEnvironmentVariables, wantMsg: "CNI_CONTAINERID"},
		{name: "bad ifname", env: with("CNI_IFNAME", "a/b"), stdin: conf("1.1.0"), wantCode: types.ErrInvalidEnvironmentVariables, wantMsg: "CNI_IFNAME"},
		{name: "unknown command", env: with("CNI_COMMAND", "FOO"), stdin: conf("1.1.0"), wantCode: types.ErrInvalidEnvironmentVariables, wantMsg: "FOO"},
		{name: "not JSON", env: full, stdin: `{`, wantCode: types.ErrDecodingFailure, wantMsg: "network config"},
		{name: "no name", env: full, stdin: `{"cniVersion":"1.1.0"}`, wantCode: types.ErrInvalidNetworkConfig, wantMsg: "network name"},
		{name: "bad name", env: full, stdin: `{"cniVersion":"1.1.0","name":"a b"}`, wantCode: types.ErrInvalidNetworkConfig, wantMsg: "network name"},
		{name: "unsupported version", env: full, stdin: conf("0.3.1"), wantCode: types.ErrIncompatibleCNIVersion, wantMsg: "incompatible CNI versions"},
		{name: "GC before 1.1.0", env: with("CNI_COMMAND", "GC"), stdin: conf("1.0.0"), wantCode: types.ErrIncompatibleCNIVersion, wantMsg: "GC"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got *CmdArgs
			record := func(a *CmdArgs) error { got = a; return nil }
			var out, errOut bytes.Buffer
			err := dispatch(Commands{Add: record, Del: record, Check: record, GC: record, Status: record}, "weft test",
				func(k string) string { return tc.env[k] }, strings.NewReader(tc.stdin), &out, &errOut, time.Now())
			if tc.wantCode != 0 {
				if err == nil || err.Code != tc.wantCode || !strings.Contains(err.Msg+" "+err.Details, tc.wantMsg) {
					t.Fatalf("got %v, want code %d mentioning %q", err, tc.wantCode, tc.wantMsg)
				}
				if got != nil {
					t.Fatalf("command ran on bad input: %+v", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if out.String() != tc.wantOut || errOut.String() != tc.wantErr {
				t.Fatalf("stdout %q stderr %q, want %q and %q", out.String(), errOut.String(), tc.wantOut, tc.wantErr)
			}
			if tc.wantArgs != nil && (got == nil || got.ContainerID != tc.wantArgs.ContainerID || got.Netns != tc.wantArgs.Netns ||
				got.IfName != tc.wantArgs.IfName || got.Args != tc.wantArgs.Args || got.Path != tc.wantArgs.Path || !bytes.Equal(got.StdinData, tc.wantArgs.StdinData)) {
				t.Fatalf("command got %+v, want %+v", got, tc.wantArgs)
			}
		})
	}
}

// TestResultVersions: ADD's result has the shape of the configuration's
// cniVersion, and a printed result reads back as a prevResult.
func TestResultVersions(t *testing.T) {
	one := 1
	_, v4, _ := net.ParseCIDR("10.244.1.5/24")
	_, v6, _ := net.ParseCIDR("fd00::5/64")
	v4.IP, v6.IP = net.ParseIP("10.244.1.5"), net.ParseIP("fd00::5")
	r := &Result{
		Interfaces: []*Interface{{Name: "weft0", Mac: "02:00:00:00:00:01"}, {Name: "eth0", Mac: "02:00:00:00:00:02", Mtu: 1450, Sandbox: "/run/netns/p"}},
		IPs:        []*IPConfig{{Interface: &one, Address: types.IPNet(*v4), Gateway: net.ParseIP("10.244.1.1")}, {Interface: &one, Address: types.IPNet(*v6)}},
	}
	for _, tc := range []struct{ version, want string }{
		{"1.1.0", `{"cniVersion":"1.1.0","interfaces":[{"name":"weft0","mac":"02:00:00:00:00:01"},{"name":"eth0","mac":"02:00:00:00:00:02","mtu":1450,"sandbox":"/run/netns/p"}],` +
			`"ips":[{"interface":1,"address":"10.244.1.5/24","gateway":"10.244.1.1"},{"interface":1,"address":"fd00::5/64"}],"dns":{}}`},
		{"0.4.0", `{"cniVersion":"0.4.0","interfaces":[{"name":"weft0","mac":"02:00:00:00:00:01"},{"name":"eth0","mac":"02:00:00:00:00:02","sandbox":"/run/netns/p"}],` +
			`"ips":[{"version":"4","interface":1,"address":"10.244.1.5/24","gateway":"10.244.1.1"},{"version":"6","interface":1,"address":"fd00::5/64"}],"dns":{}}`},
	} {
		var out bytes.Buffer
		if err := r.print(&out, tc.version); err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(out.String()); got != tc.want {
			t.Fatalf("%s result:\n got %s\nwant %s", tc.version, got, tc.want)
		}
		var raw map[string]any
		if err := json.Unmarshal(out.Bytes(), &raw); err != nil {
			t.Fatal(err)
		}
		prev, err := parsePrevResult(raw)
		if err != nil {
			t.Fatal(err)
		}
		if len(prev.IPs) != 2 || !prev.IPs[1].Address.IP.Equal(v6.IP) || *prev.IPs[0].Interface != 1 || prev.Interfaces[1].Sandbox != "/run/netns/p" {
			t.Fatalf("%s prevResult read back as %+v", tc.version, prev)
		}
	}
}
