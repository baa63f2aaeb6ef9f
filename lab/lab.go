// Package lab turns one Linux machine into a multi-node Kubernetes cluster
// made of network namespaces: an underlay bridge, a control plane (etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler) in its own
// namespace, one namespace per node, and an external host for outside
// clients.
//
// Everything the lab creates is named with NSPrefix or lives in its
// directory, so Down can remove all of it, also after a crash.
package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/weftnet/weft/deploy"
	"github.com/weftnet/weft/internal/fsutil"
	"github.com/weftnet/weft/internal/netnsutil"
)

// DefaultDir is where a lab keeps its state, logs and kubeconfigs.
const DefaultDir = "/var/lib/weft-lab"

// AgentPort is weft-agent's /healthz and /metrics port on every lab node.
const AgentPort = 9876

// Options configure Up.
type Options struct {
	Nodes   int
	Routing string // "hostgw" or "vxlan"
	// ProxyMode is the agents' service proxy: iptables (default),
	// nftables or ebpf.
	ProxyMode string `json:"proxyMode,omitempty"`
	Dir       string
	BinDir    string    // kube-apiserver, kube-controller-manager, kube-scheduler, weftctl
	APIPort   int       // the admin kubeconfig's port on the host's loopback
	Out       io.Writer `json:"-"`
}

// State is what a running lab records in Dir/lab.json.
type State struct {
	Options
	Members []Member `json:"members"`
	Started time.Time
}

func statePath(dir string) string { return filepath.Join(dir, "lab.json") }

// AdminKubeconfig is the path of the admin's kubeconfig.
func AdminKubeconfig(dir string) string { return filepath.Join(dir, "admin.kubeconfig") }

// Up builds the lab. On failure it removes whatever it made.
func Up(ctx context.Context, o Options) (err error) {
	if o.Nodes < 1 {
		return fmt.Errorf("--nodes: need at least 1, got %d", o.Nodes)
	}
	if o.Routing != "hostgw" && o.Routing != "vxlan" {
		return fmt.Errorf("--routing: %q is neither hostgw nor vxlan", o.Routing)
	}
	if o.ProxyMode == "" {
		o.ProxyMode = "iptables"
	}
	if !slices.Contains(ProxyModes, o.ProxyMode) {
		return fmt.Errorf("--proxy-mode: %q is not one of %v", o.ProxyMode, ProxyModes)
	}
	if existing, _ := labNamespaces(); len(existing) > 0 {
		return fmt.Errorf("a lab is already running (namespaces %v): run `weftctl lab down` first", existing)
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	begin := time.Now()
	step := func(format string, args ...any) {
		fmt.Fprintf(o.Out, "[%5.1fs] %s\n", time.Since(begin).Seconds(), fmt.Sprintf(format, args...))
	}
	defer func() {
		if err != nil {
			step("failed: %v; removing the lab", err)
			if derr := Down(o.Dir); derr != nil {
				err = errors.Join(err, derr)
			}
		}
	}()
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return err
	}
	members := Members(o.Nodes)
	st := State{Options: o, Members: members, Started: begin}
	if err := writeJSON(statePath(o.Dir), st); err != nil {
		return err
	}

	step("underlay %s: control plane %s, external host %s, %d nodes", underlayNet, ControlIP, ExternalIP, o.Nodes)
	if err := buildFabric(members); err != nil {
		return err
	}
	step("certificates and kubeconfigs")
	if err := issueCerts(o.Dir, NodeMembers(members), o.APIPort); err != nil {
		return err
	}
	cp := controlPlane(o.Dir, o.BinDir)
	step("etcd and kube-apiserver")
	for _, p := range cp[:2] {
		if _, err := start(o.Dir, p); err != nil {
			return err
		}
	}
	waitCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := waitAPIServer(waitCtx, o.Dir); err != nil {
		return err
	}
	step("kube-controller-manager and kube-scheduler")
	for _, p := range cp[2:] {
		if _, err := start(o.Dir, p); err != nil {
			return err
		}
	}
	step("API on https://127.0.0.1:%d (forwarded into the lab)", o.APIPort)
	if _, err := start(o.Dir, forwarder(o)); err != nil {
		return err
	}
	client, err := Client(AdminKubeconfig(o.Dir))
	if err != nil {
		return err
	}
	step("namespace and RBAC from deploy/agent")
	for _, m := range [][]byte{deploy.Namespace, deploy.RBAC} {
		if err := applyManifests(waitCtx, client, m); err != nil {
			return err
		}
	}
	step("weft-agent and kubelet on %d nodes (routing %s, proxy %s), external workload", o.Nodes, o.Routing, o.ProxyMode)
	if err := prepareProxyMode(o, NodeMembers(members)); err != nil {
		return err
	}
	for _, p := range nodeDaemons(o, members) {
		if _, err := start(o.Dir, p); err != nil {
			return err
		}
	}
	if err := waitNodesReady(waitCtx, client, NodeMembers(members)); err != nil {
		return err
	}
	step("lab up: export KUBECONFIG=%s", AdminKubeconfig(o.Dir))
	return nil
}

// Restart kills a lab daemon (as a crash would) and starts it again.
func Restart(dir, name string) error {
	st, err := Load(dir)
	if err != nil {
		return err
	}
	for _, p := range append(controlPlane(dir, st.BinDir), nodeDaemons(st.Options, st.Members)...) {
		if p.Name != name {
			continue
		}
		if pid, ok := alive(dir, name); ok {
			stopPIDs([]int{pid}, 0)
		}
		_, err := start(dir, p)
		return err
	}
	return fmt.Errorf("no lab daemon named %q", name)
}

// PID returns the pid of a running lab daemon.
func PID(dir, name string) (int, bool) { return alive(dir, name) }

// NodeDir is a node's own state directory (CNI config, IPAM, pods, logs).
func NodeDir(dir, node string) string { return filepath.Join(dir, "nodes", node) }

// CNIBinDir is where the lab's nodes find the CNI plugins.
func CNIBinDir(binDir string) string { return filepath.Join(binDir, "cni") }

// nodeDaemons are the per-node processes and the external host's workload.
func nodeDaemons(o Options, members []Member) []Proc {
	procs := []Proc{{Name: "ext-workload", NS: netnsutil.RunDir + "/" + ExternalNS, Args: []string{
		filepath.Join(o.BinDir, "weft-workload"), "--name", "external",
	}}}
	for _, n := range NodeMembers(members) {
		nd := NodeDir(o.Dir, n.Name)
		cg := o.nodeCgroup(n.Name)
		procs = append(procs,
			Proc{Name: n.Name + "-agent", NS: n.NSPath(), Cgroup: cg, Args: append([]string{
				filepath.Join(o.BinDir, "weft-agent"),
				"--kubeconfig", filepath.Join(o.Dir, n.Name+"-agent.kubeconfig"), "--node-name", n.Name,
				"--routing", o.Routing, "--cluster-cidr", ClusterCIDR, "--resync", "10s",
				"--cni-conf-dir", filepath.Join(nd, "net.d"), "--ipam-data-dir", filepath.Join(nd, "ipam"),
				"--healthz-addr", fmt.Sprintf(":%d", AgentPort),
				"--node-ip", n.IP.String(),
			}, o.proxyArgs(n.Name)...)},
			Proc{Name: n.Name + "-kubelet", NS: n.NSPath(), Cgroup: cg, Args: []string{
				filepath.Join(o.BinDir, "weftctl"), "lab", "kubelet", "--dir", o.Dir, "--node", n.Name,
			}},
		)
	}
	return procs
}

// forwarder is the daemon that makes the API server reachable from the
// host's loopback without touching the host's networking: it listens on
// 127.0.0.1 and dials from inside the control-plane namespace.
func forwarder(o Options) Proc {
	return Proc{Name: "api-forward", Args: []string{
		filepath.Join(o.BinDir, "weftctl"), "lab", "forward",
		"--ns", netnsutil.RunDir + "/" + ControlNS,
		"--listen", fmt.Sprintf("127.0.0.1:%d", o.APIPort),
		"--to", fmt.Sprintf("%s:%d", ControlIP, APIServerPort),
	}}
}

// NodeMembers returns the members that are nodes.
func NodeMembers(members []Member) []Member {
	var nodes []Member
	for _, m := range members {
		if m.Name != "cp" && m.Name != "ext" {
			nodes = append(nodes, m)
		}
	}
	return nodes
}

// Down stops every lab process, removes every lab namespace and the lab dir.
// It works from what is on the machine, so it also cleans up after a crash.
func Down(dir string) error {
	names, err := labNamespaces()
	if err != nil {
		return err
	}
	paths := make([]string, len(names))
	for i, n := range names {
		paths[i] = netnsutil.RunDir + "/" + n
	}
	inNS, err := pidsInNamespaces(paths)
	if err != nil {
		return err
	}
	stopPIDs(append(recordedPIDs(dir), inNS...), 5*time.Second)
	var errs []error
	if err := removeProxyMode(dir); err != nil {
		errs = append(errs, err)
	}
	for _, n := range names {
		if err := netnsutil.Delete(n); err != nil {
			errs = append(errs, fmt.Errorf("deleting namespace %s: %w", n, err))
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Load reads a running lab's state.
func Load(dir string) (*State, error) {
	b, err := os.ReadFile(statePath(dir))
	if err != nil {
		return nil, fmt.Errorf("no lab in %s: %w", dir, err)
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", statePath(dir), err)
	}
	return &st, nil
}

// ProcStatus is one daemon's state for `weftctl lab status`.
type ProcStatus struct {
	Name    string
	PID     int
	Running bool
	Log     string
}

// Procs lists the lab's daemons.
func Procs(dir string) []ProcStatus {
	entries, _ := os.ReadDir(filepath.Join(dir, "pids"))
	var out []ProcStatus
	for _, e := range entries {
		name := e.Name()[:len(e.Name())-len(".pid")]
		pid, ok := alive(dir, name)
		out = append(out, ProcStatus{Name: name, PID: pid, Running: ok, Log: logPath(dir, name)})
	}
	return out
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(path, b, 0o644)
}
