package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/weftnet/weft/lab"
	"github.com/weftnet/weft/test/bench/benchlab"
)

// proc is a process the bench started in a namespace.
type proc = benchlab.Proc

// subject is one proxy under test: a binary (weft-proxy or kube-proxy)
// and the flags that make it this subject. Every subject gets the same
// common flags (kubeconfig, node name and IP, metrics and health
// addresses: commonArgs). A subject whose needs flag is missing from its
// binary's --help is reported as not in this build (the modes other
// helpers are adding), not failed.
type subject struct {
	name  string
	prog  string   // "weft-proxy" or "kube-proxy"
	flags []string // what makes it this subject
	needs string   // a flag the binary must have ("" none)
	// bothNodes: the same proxy runs on node2 too (DSR needs the
	// backend's node to take part).
	bothNodes bool
	// routing: no proxy; the generator sends to the pods' own addresses
	// (flow i to pod i mod n), which the node routes: the reference a
	// proxy's cost is taken above.
	routing bool
}

func (s subject) ebpf() bool { return s.prog == "weft-proxy" && slices.Contains(s.flags, "ebpf") }

// allSubjects is the menu; -subjects picks from it, in its order.
func allSubjects() []subject {
	ebpf := []string{"--mode", "ebpf"}
	return []subject{
		{name: refRoute, routing: true},
		{name: "weft-ebpf", prog: "weft-proxy", flags: ebpf},
		{name: "weft-ebpf-dsr", prog: "weft-proxy", flags: append(slices.Clone(ebpf), "--bpf-lb-mode", "dsr"), needs: "bpf-lb-mode", bothNodes: true},
		{name: "weft-ebpf-xdp-generic", prog: "weft-proxy", flags: append(slices.Clone(ebpf), "--bpf-xdp", "generic"), needs: "bpf-xdp"},
		{name: "weft-ebpf-xdp-native", prog: "weft-proxy", flags: append(slices.Clone(ebpf), "--bpf-xdp", "native"), needs: "bpf-xdp"},
		{name: "weft-nftables", prog: "weft-proxy", flags: []string{"--mode", "nftables"}},
		{name: "weft-iptables", prog: "weft-proxy", flags: []string{"--mode", "iptables"}},
		{name: "kp-iptables", prog: "kube-proxy", flags: []string{"--proxy-mode", "iptables"}},
		{name: "kp-nftables", prog: "kube-proxy", flags: []string{"--proxy-mode", "nftables"}},
	}
}

const defaultSubjects = refRoute + ",weft-ebpf,weft-ebpf-dsr,weft-ebpf-xdp-generic,weft-ebpf-xdp-native,weft-nftables,kp-iptables,kp-nftables"

const (
	metricsAddr = "127.0.0.1:10249"
	healthzAddr = "127.0.0.1:10256"
)

// commonArgs is the command line of s on the node named node with
// address ip (NodePorts answer on ip alone for every subject); uplink is
// the node's link toward the client, the eBPF mode's device.
func commonArgs(s subject, bin, kc, node, ip, uplink string) []string {
	if s.prog == "kube-proxy" {
		return append([]string{filepath.Join(bin, "kube-proxy"), "--kubeconfig", kc, "--hostname-override", node,
			"--cluster-cidr", lab.ClusterCIDR, "--conntrack-max-per-core=0", "--nodeport-addresses", ip + "/32",
			"--metrics-bind-address", metricsAddr, "--healthz-bind-address", healthzAddr}, s.flags...)
	}
	args := []string{filepath.Join(bin, s.prog), "--kubeconfig", kc, "--node-name", node, "--node-ip", ip,
		"--cluster-cidr", lab.ClusterCIDR, "--nodeport-addresses", ip + "/32",
		"--metrics-addr", metricsAddr, "--healthz-addr", healthzAddr}
	if s.ebpf() {
		args = append(args, "--bpf-devices", uplink)
	}
	return append(args, s.flags...)
}

// available reports whether s's binary has the flag s needs.
func available(s subject, bin string) (bool, error) {
	if s.needs == "" {
		return true, nil
	}
	out, _ := exec.Command(filepath.Join(bin, s.prog), "--help").CombinedOutput()
	if len(out) == 0 {
		return false, fmt.Errorf("%s --help printed nothing", s.prog)
	}
	return strings.Contains(string(out), "-"+s.needs+" "), nil
}

// ebpfEnv is where weft-proxy --mode ebpf runs: a bpffs and the cgroup v2
// hierarchy mounted in the bench's private mount namespace, and empty
// cgroups the bench made there (one per node), so that the socket programs
// translate nobody's sockets; the generator and the backends are in no
// such cgroup and meet only the per-packet path.
type ebpfEnv struct{ *benchlab.BPFMounts }

func newEBPFEnv() (*ebpfEnv, error) {
	m, err := benchlab.MountBPF()
	if err != nil {
		return nil, err
	}
	return &ebpfEnv{m}, nil
}

// args are the flags that put a proxy (key: the subject and its node) in
// the bench's bpffs and a cgroup of its own; its pins start empty.
func (e *ebpfEnv) args(key string) ([]string, error) {
	pin := filepath.Join(e.BPFFS, key)
	if err := os.RemoveAll(pin); err != nil {
		return nil, err
	}
	cg := filepath.Join(e.Cgroup2, fmt.Sprintf("weft-pktbench-%d-%s", os.Getpid(), key))
	if err := os.Mkdir(cg, 0o755); err != nil && !os.IsExist(err) {
		return nil, fmt.Errorf("creating the bench cgroup: %w", err)
	}
	return []string{"--cgroup-root", cg, "--bpf-pin-path", pin}, nil
}

// release removes a proxy's pins (its links and maps go with them) and
// its cgroup.
func (e *ebpfEnv) release(key string) {
	_ = os.RemoveAll(filepath.Join(e.BPFFS, key))
	_ = os.Remove(filepath.Join(e.Cgroup2, fmt.Sprintf("weft-pktbench-%d-%s", os.Getpid(), key)))
}

// reset releases every proxy's.
func (e *ebpfEnv) reset() {
	ents, _ := os.ReadDir(e.BPFFS)
	for _, d := range ents {
		e.release(d.Name())
	}
}

func (e *ebpfEnv) close() {
	e.reset()
	e.Unmount()
}
