package flagfile

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type list []string

func (l *list) String() string { return strings.Join(*l, ",") }
func (l *list) Set(s string) error {
	*l = append(*l, strings.Split(s, ",")...)
	return nil
}

type flags struct {
	fs      *flag.FlagSet
	routing string
	policy  bool
	resync  time.Duration
	mtu     int
	cidrs   list
}

func newFlags(t *testing.T, args ...string) *flags {
	t.Helper()
	f := &flags{fs: flag.NewFlagSet("test", flag.ContinueOnError)}
	f.fs.String("config", "", "")
	f.fs.StringVar(&f.routing, "routing", "hostgw", "")
	f.fs.BoolVar(&f.policy, "network-policy", true, "")
	f.fs.DurationVar(&f.resync, "resync", 30*time.Second, "")
	f.fs.IntVar(&f.mtu, "mtu", 0, "")
	f.fs.Var(&f.cidrs, "cluster-cidr", "")
	if err := f.fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return f
}

func write(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "agent.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestApply(t *testing.T) {
	f := newFlags(t, "--mtu", "1400")
	p := write(t, "routing: vxlan\nnetwork-policy: false\nresync: 1m\nmtu: 9000\ncluster-cidr: [10.244.0.0/16, fd00::/56]\n")
	if err := Apply(f.fs, p, "config"); err != nil {
		t.Fatal(err)
	}
	if f.routing != "vxlan" || f.policy || f.resync != time.Minute {
		t.Errorf("routing %q policy %v resync %v: the file's values were not applied", f.routing, f.policy, f.resync)
	}
	if f.mtu != 1400 {
		t.Errorf("mtu %d: the command line's 1400 must win over the file", f.mtu)
	}
	if got := f.cidrs.String(); got != "10.244.0.0/16,fd00::/56" {
		t.Errorf("cluster-cidr %q", got)
	}
}

// TestApplyDir reads a mounted ConfigMap: one file per key, the runtime's
// dot-named bookkeeping entries ignored.
func TestApplyDir(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{"routing": "vxlan\n", "cluster-cidr": "10.244.0.0/16,fd00::/56", "..data": "x"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "..2026_11_23"), 0o755); err != nil {
		t.Fatal(err)
	}
	f := newFlags(t)
	if err := Apply(f.fs, dir, "config"); err != nil {
		t.Fatal(err)
	}
	if f.routing != "vxlan" || f.cidrs.String() != "10.244.0.0/16,fd00::/56" {
		t.Fatalf("routing %q cluster-cidr %q", f.routing, f.cidrs.String())
	}
	if err := os.WriteFile(filepath.Join(dir, "rouitng"), []byte("vxlan"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Apply(newFlags(t).fs, dir, "config"); err == nil || !strings.Contains(err.Error(), `key "rouitng": unknown`) {
		t.Fatalf("error %v: want the unknown key named", err)
	}
}

func TestApplyRejects(t *testing.T) {
	for _, tc := range []struct{ name, body, want string }{
		{"unknown key", "routing: vxlan\nroutnig: bgp\n", `key "routnig": unknown`},
		{"bad value", "resync: soon\n", `key "resync": parse error`},
		{"bad bool", "network-policy: maybe\n", `key "network-policy"`},
		{"nested", "routing:\n  mode: vxlan\n", `key "routing": a map[string]interface {} is not a flag value`},
		{"list in list", "cluster-cidr: [[10.0.0.0/8]]\n", `key "cluster-cidr": item 0`},
		{"reserved", "config: /etc/other.yaml\n", `key "config": only accepted on the command line`},
		{"not a mapping", "- routing\n", "not a mapping"},
		{"duplicate key", "mtu: 1400\nmtu: 9000\n", "not a mapping"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFlags(t)
			p := write(t, tc.body)
			err := Apply(f.fs, p, "config")
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), p) {
				t.Fatalf("error %v: want one naming %s and containing %q", err, p, tc.want)
			}
		})
	}
}

func TestApplyMissingFile(t *testing.T) {
	f := newFlags(t)
	if err := Apply(f.fs, filepath.Join(t.TempDir(), "absent.yaml")); err == nil {
		t.Fatal("a missing config file must be an error")
	}
}
