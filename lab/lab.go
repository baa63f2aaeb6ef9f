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
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/weftnet/weft/internal/fsutil"
	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/internal/proc"
)

// DefaultDir is where a lab keeps its state, logs and kubeconfigs.
const DefaultDir = "/var/lib/weft-lab"

// AgentPort is weft-agent's /healthz and /metrics port on every lab node.
const AgentPort = 9876

// Options configure Up.
type Options struct {
	Nodes   int
	Routing string // "hostgw", "vxlan" or "bgp"
	// Racks puts the nodes on that many underlay subnets joined by a ToR
	// router (0 or 1: one segment).
	Racks int `json:"racks,omitempty"`
	// Zones spreads the nodes over that many zones (topology.kubernetes.io/zone
	// zone-1 .. zone-N, node i in zone ((i-1) mod N)+1); 0: each node is
	// a zone of its own. With racks, each rack is a zone.
	Zones int `json:"zones,omitempty"`
	// ProxyMode is the agents' service proxy: iptables (default),
	// nftables or ebpf.
	ProxyMode string `json:"proxyMode,omitempty"`
	// Dataplane is where the agents' packet rules live: iptables, or
	// nftables (the nftables overlay: proxy, NetworkPolicy and the
	// agents' own rules in nftables, no iptables tool run). Empty: the
	// proxy mode's (nftables for the nftables proxy, else iptables).
	Dataplane string `json:"dataplane,omitempty"`
	// DualStack gives the lab IPv6 beside IPv4: the underlay, the nodes'
	// addresses, podCIDRs (ClusterCIDR6) and Services (ServiceCIDR6). One
	// segment only.
	DualStack bool `json:"dualStack,omitempty"`
	// PodCIDRSize is the prefix length of each node's podCIDR (the
	// controller-manager's --node-cidr-mask-size; 0: 24).
	PodCIDRSize int `json:"podCIDRSize,omitempty"`
	// Encryption of pod traffic between nodes: "" (none) or "wireguard"
	// (deploy/components/wireguard; userspace where the kernel has none).
	Encryption string `json:"encryption,omitempty"`
	Dir        string
	BinDir     string    // kube-apiserver, kube-controller-manager, kube-scheduler, weftctl
	APIPort    int       // the admin kubeconfig's port on the host's loopback
	Out        io.Writer `json:"-"`
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

// UnderlayKubeconfig is the admin's kubeconfig for use from a lab
// namespace: its server is the API server's underlay address.
func UnderlayKubeconfig(dir string) string { return filepath.Join(dir, "admin-underlay.kubeconfig") }

// Up builds the lab. On failure it removes whatever it made.
func Up(ctx context.Context, o Options) (err error) {
	if o.Nodes < 1 {
		return fmt.Errorf("--nodes: need at least 1, got %d", o.Nodes)
	}
	if err := checkTopology(o); err != nil {
		return err
	}
	if err := resolveDataplane(&o); err != nil {
		return err
	}
	if err := checkPodCIDRSize(o.PodCIDRSize); err != nil {
		return err
	}
	if err := checkNodes(o); err != nil {
		return err
	}
	if existing, _ := labNamespaces(); len(existing) > 0 {
		return fmt.Errorf("a lab is already running (namespaces %v): run `weftctl lab down` first", existing)
	}
	// No lab runs: lab cgroups still on the machine are a crashed lab's.
	if err := errors.Join(removeLabCgroups(o.Dir), removeKubeletCgroups()); err != nil {
		return fmt.Errorf("a crashed lab's cgroups: %w", err)
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	begin := time.Now()
	step := func(format string, args ...any) {
		fmt.Fprintf(o.Out, "[%5.1fs] %s\n", time.Since(begin).Seconds(), fmt.Sprintf(format, args...))
	}
	members := Members(o.Nodes, o.Racks)
	if o.DualStack {
		addIPv6(members)
	}
	defer func() {
		if err != nil {
			step("failed: %v; removing the lab", err)
			for _, n := range NodeMembers(members) {
				for _, log := range []string{logPath(o.Dir, n.Name+"-kubelet"), AgentLog(o.Dir, n.Name)} {
					if log != "" {
						fmt.Fprintf(o.Out, "--- the end of %s:\n%s", log, tail(log, 8))
					}
				}
			}
			if derr := Down(o.Dir); derr != nil {
				err = errors.Join(err, derr)
			}
		}
	}()
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return err
	}
	st := State{Options: o, Members: members, Started: begin}
	if err := writeJSON(statePath(o.Dir), st); err != nil {
		return err
	}

	if o.Racks > 1 {
		step("underlay: %d racks (172.18.<rack>.0/24) joined by a ToR, control plane %s, external host %s behind the ToR, %d nodes", o.Racks, ControlIP, members[1].IP, o.Nodes)
	} else {
		step("underlay %s: control plane %s, external host %s, %d nodes", underlayNet, ControlIP, ExternalIP, o.Nodes)
	}
	if err := buildFabric(members, o.Racks); err != nil {
		return err
	}
	step("certificates and kubeconfigs")
	if err := issueCerts(o.Dir, NodeMembers(members), o.APIPort); err != nil {
		return err
	}
	cp := controlPlane(o)
	step("etcd and kube-apiserver")
	for _, p := range cp[:2] {
		if _, err := start(o.Dir, p); err != nil {
			return err
		}
	}
	// Bounds against hangs only: a loaded machine is slow.
	waitCtx, cancel := context.WithTimeout(ctx, 240*time.Second)
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
	step("node file systems")
	if err := prepareProxyMode(o, NodeMembers(members)); err != nil {
		return err
	}
	step("containerd and kubelet on %d nodes", o.Nodes)
	if err := startRealNodes(waitCtx, o, NodeMembers(members)); err != nil {
		return err
	}
	daemons := []Proc{extWorkload(o), lbDaemon(o)}
	if o.Racks > 1 && o.Routing == "bgp" {
		tor, err := torDaemon(o.Dir, members, clusterASN)
		if err != nil {
			return err
		}
		step("ToR: BIRD, AS %d, a BGP session with each node", ToRASN)
		daemons = append(daemons, tor)
	}
	step("external workload and load balancer (%s)", LBPool)
	for _, p := range daemons {
		if _, err := start(o.Dir, p); err != nil {
			return err
		}
	}
	step("weft from deploy/ (routing %s, proxy %s, data plane %s, encryption %s)", o.Routing, o.ProxyMode, o.Dataplane, cmp.Or(o.Encryption, "none"))
	if err := install(waitCtx, &st); err != nil {
		return err
	}
	nodes, err := waitNodesReady(waitCtx, client, NodeMembers(members))
	if err != nil {
		return err
	}
	if o.Racks <= 1 {
		if err := routeControlPlaneToPods(NodeMembers(members), nodes); err != nil {
			return err
		}
	}
	if err := WaitAgents(waitCtx, client, o.Nodes); err != nil {
		return err
	}
	step("lab up: export KUBECONFIG=%s", AdminKubeconfig(o.Dir))
	return nil
}

// checkNodes checks, before anything is made, that the machine has what
// the nodes need: the programs and images make kube and make node build,
// runc, and cgroup v1 hierarchies.
func checkNodes(o Options) error {
	for _, f := range []string{filepath.Join(o.BinDir, "kubelet"), filepath.Join(nodeBin(o.BinDir), "containerd"),
		filepath.Join(nodeBin(o.BinDir), "containerd-shim-runc-v2"), filepath.Join(nodeBin(o.BinDir), "ctr"), runcPath,
		filepath.Join(TestImagesDir(o.BinDir), "pause.oci.tar")} {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("the lab's nodes: %w (make kube node builds their programs and images)", err)
		}
	}
	if hs, err := v1Hierarchies(); err != nil || len(hs) == 0 {
		return fmt.Errorf("the lab's nodes run the kubelet on the machine's cgroup v1 hierarchies beside the v2 one, and this machine has none (%v)", err)
	}
	return nil
}

// checkTopology refuses a routing mode the lab's underlay cannot carry.
func checkTopology(o Options) error {
	if !slices.Contains([]string{"hostgw", "vxlan", "bgp"}, o.Routing) {
		return fmt.Errorf("--routing: %q is not one of hostgw, vxlan, bgp", o.Routing)
	}
	if o.Encryption != "" && o.Encryption != "none" && o.Encryption != "wireguard" {
		return fmt.Errorf("--encryption: %q is neither none nor wireguard", o.Encryption)
	}
	if o.Racks < 0 || o.Racks > MaxRacks {
		return fmt.Errorf("--racks: %d is not between 0 and %d", o.Racks, MaxRacks)
	}
	if o.Racks > 1 && o.DualStack {
		return fmt.Errorf("--dual-stack: the lab's racks are IPv4 only; use one segment (--racks 0)")
	}
	if o.Racks > 1 && o.Routing == "hostgw" {
		return fmt.Errorf("--routing hostgw: nodes on %d racks are on different subnets, and host-gw routes only to nodes on the node's own segment (its next hops must be on-link): use --routing bgp (routes learned from the ToR and the other nodes) or vxlan", o.Racks)
	}
	return nil
}

// Restart kills a lab daemon (as a crash would) and starts it again. A
// node's weft-agent ("node1-agent") is a container its kubelet restarts:
// Restart kills it and waits for the new one.
func Restart(dir, name string) error {
	st, err := Load(dir)
	if err != nil {
		return err
	}
	if node, ok := strings.CutSuffix(name, "-agent"); ok {
		pid, ok := AgentPID(node)
		if !ok {
			return fmt.Errorf("no weft-agent running on %s", node)
		}
		proc.Stop([]int{pid}, 0)
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if now, ok := AgentPID(node); ok && now != pid {
				return nil
			}
		}
		return fmt.Errorf("the kubelet of %s did not restart weft-agent within 60s", node)
	}
	daemons := append(controlPlane(st.Options), extWorkload(st.Options), lbDaemon(st.Options))
	for _, n := range NodeMembers(st.Members) {
		if holder, ok := alive(dir, n.Name+"-ns"); ok {
			daemons = append(daemons, st.inNodeMounts(n, holder)...)
		}
	}
	for _, p := range daemons {
		if p.Name != name {
			continue
		}
		if pid, ok := alive(dir, name); ok {
			proc.Stop([]int{pid}, 0)
		}
		_, err := start(dir, p)
		return err
	}
	return fmt.Errorf("no lab daemon named %q", name)
}

// PID returns the pid of a running lab daemon, or of a node's weft-agent
// container ("node1-agent").
func PID(dir, name string) (int, bool) {
	if node, ok := strings.CutSuffix(name, "-agent"); ok {
		return AgentPID(node)
	}
	return alive(dir, name)
}

// NodeDir is a node's own state directory (CNI config, IPAM, pods, logs).
func NodeDir(dir, node string) string { return filepath.Join(dir, "nodes", node) }

// extWorkload is the external host's workload.
func extWorkload(o Options) Proc {
	return Proc{Name: "ext-workload", NS: netnsutil.RunDir + "/" + ExternalNS, Args: []string{
		filepath.Join(o.BinDir, "weft-workload"), "--name", "external",
	}}
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
	proc.Stop(append(recordedPIDs(dir), inNS...), 5*time.Second)
	var errs []error
	// Real nodes: their pods' processes are in the nodes' v1 cgroups,
	// not in lab namespaces.
	if err := removeKubeletCgroups(); err != nil {
		errs = append(errs, err)
	}
	if err := removeProxyMode(dir); err != nil {
		errs = append(errs, err)
	}
	removeCreatedPaths(dir)
	if err := restoreSysctls(); err != nil {
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

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error() + "\n"
	}
	lines := strings.SplitAfter(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "") + "\n"
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(path, b, 0o644)
}
