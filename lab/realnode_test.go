package lab

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseV1Hierarchies(t *testing.T) {
	// A hybrid machine's /proc/self/cgroup (this project's machines).
	got := parseV1Hierarchies(`9:name=systemd:/
8:pids:/
4:memory:/process_api/594f7958
2:cpu,cpuacct:/
0::/
`)
	want := []v1Hierarchy{{"none,name=systemd", "systemd"}, {"pids", "pids"}, {"memory", "memory"}, {"cpu,cpuacct", "cpu,cpuacct"}}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if got := parseV1Hierarchies("0::/user.slice\n"); len(got) != 0 {
		t.Errorf("a cgroup v2 only machine: got %v, want none", got)
	}
}

// TestCheckNodesNamesWhatIsMissing: lab up on a machine without the
// nodes' programs fails before making anything, naming the first missing
// file and what builds it.
func TestCheckNodesNamesWhatIsMissing(t *testing.T) {
	bin := t.TempDir()
	err := checkNodes(Options{BinDir: bin})
	if err == nil || !strings.Contains(err.Error(), filepath.Join(bin, "kubelet")) || !strings.Contains(err.Error(), "make kube node") {
		t.Fatalf("got %v, want an error naming %s and make kube node", err, filepath.Join(bin, "kubelet"))
	}
}

// TestNodeBinds: every bind of a node's mount namespace has its source in
// the node's own directories (its bpffs one too, in every mode), and the
// sockets' directories are at their usual (short) paths.
func TestNodeBinds(t *testing.T) {
	o := Options{Dir: "/var/lib/weft-lab", ProxyMode: "iptables"}
	binds := o.nodeBinds("node2")
	var targets []string
	for _, b := range binds {
		targets = append(targets, b.Target)
		own := NodeDir(o.Dir, "node2") + "/"
		if b.Target == "/sys/fs/bpf" {
			own = filepath.Join(bpffsDir(o.Dir), "node2")
		}
		if !strings.HasPrefix(b.Source, own) {
			t.Errorf("bind %s from %s: not the node's own", b.Target, b.Source)
		}
	}
	for _, p := range []string{"/etc/cni/net.d", "/opt/cni/bin", "/var/lib/weft", "/run/xtables.lock", "/var/lib/kubelet", "/run/containerd"} {
		if !slices.Contains(targets, p) {
			t.Errorf("no bind over %s in %v", p, targets)
		}
	}
	if !slices.Contains(targets, "/sys/fs/bpf") {
		t.Error("no bpffs bind: the agent would see the machine's")
	}
}
