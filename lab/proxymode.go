package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/netnsutil"
)

// ProxyModes are the service proxy backends a lab's agents can run.
var ProxyModes = []string{"iptables", "nftables", "ebpf"}

// Dataplanes are the places the agents' packet rules can live.
var Dataplanes = []string{"iptables", "nftables"}

// resolveDataplane fills in the proxy mode and the data plane from each
// other and refuses the combinations deploy/ has no overlay for: the
// nftables data plane is deploy/overlays/nftables (whose agent has no
// capability the iptables tools need), which runs the nftables proxy,
// and the iptables and eBPF proxies run with the iptables data plane
// (the eBPF proxy's masquerade glue is an iptables rule).
func resolveDataplane(o *Options) error {
	if o.Dataplane != "" && !slices.Contains(Dataplanes, o.Dataplane) {
		return fmt.Errorf("--dataplane: %q is not one of %v", o.Dataplane, Dataplanes)
	}
	if o.ProxyMode == "" {
		o.ProxyMode = "iptables"
		if o.Dataplane == "nftables" {
			o.ProxyMode = "nftables"
		}
	}
	if !slices.Contains(ProxyModes, o.ProxyMode) {
		return fmt.Errorf("--proxy-mode: %q is not one of %v", o.ProxyMode, ProxyModes)
	}
	want := "iptables"
	if o.ProxyMode == "nftables" {
		want = "nftables"
	}
	if o.Dataplane == "" {
		o.Dataplane = want
	}
	if o.Dataplane != want {
		return fmt.Errorf("--dataplane %s with --proxy-mode %s: the %s proxy runs on the %s data plane in the lab (deploy/ has no overlay mixing them)", o.Dataplane, o.ProxyMode, o.ProxyMode, want)
	}
	return nil
}

// The eBPF mode's socket programs act on the processes of one cgroup: each
// lab node gets its own (NSPrefix + node name) in the cgroup v2 hierarchy,
// holding its agent, its kubelet and so every pod the kubelet starts; the
// pinned maps and links live on a bpffs. The lab mounts both in its
// directory (the cgroup v2 hierarchy is the machine's one, seen through a
// mount of its own), and Down removes the cgroups and the mounts.

// nodeCgroup is a node's cgroup v2 directory: the node's daemons run in
// it, and so its containers, and the eBPF mode's socket programs attach
// there.
func (o Options) nodeCgroup(node string) string {
	return filepath.Join(cgroupDir(o.Dir), NSPrefix+node)
}

// cgroupDir and bpffsDir are where the lab mounts cgroup2 and a bpffs.
func cgroupDir(dir string) string { return filepath.Join(dir, "cgroup2") }
func bpffsDir(dir string) string  { return filepath.Join(dir, "bpffs") }

// NodeBPFFS is where node's bpffs is (mounted by the lab in its directory
// dir, and bound over /sys/fs/bpf in the node's mount namespace).
func NodeBPFFS(dir, node string) string { return filepath.Join(bpffsDir(dir), node) }

// prepareProxyMode makes the nodes' cgroups and the bpffs (in every
// mode: a lab switched out of eBPF mode keeps its nodes' pins there).
func prepareProxyMode(o Options, nodes []Member) error {
	mounts := map[string]string{"cgroup2": cgroupDir(o.Dir), "bpf": bpffsDir(o.Dir)}
	for fstype, dir := range mounts {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		if err := unix.Mount(fstype, dir, fstype, 0, ""); err != nil {
			return fmt.Errorf("mounting %s on %s: %w", fstype, dir, err)
		}
	}
	for _, n := range nodes {
		if err := os.Mkdir(o.nodeCgroup(n.Name), 0o755); err != nil {
			return fmt.Errorf("node %s's cgroup: %w", n.Name, err)
		}
	}
	return nil
}

// removeProxyMode undoes prepareProxyMode from what is on the machine (the
// lab's processes must be gone): lab cgroups, and bpffs mounts under dir.
func removeProxyMode(dir string) error {
	errs := []error{removeLabCgroups(dir)}
	mounts, err := mountsUnder(dir)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, m := range mounts {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", m, err))
		}
	}
	return errors.Join(errs...)
}

// removeLabCgroups removes every lab cgroup of the machine's cgroup v2
// hierarchy, killing what is left in them: seen through dir's mount of it
// when the lab has one, through a temporary mount otherwise, so that the
// cgroups of a lab that crashed, or whose directory is gone, are found too
// (they would keep the next lab's nodes from making theirs). Without cgroup
// v2 there is nothing to remove.
func removeLabCgroups(dir string) error {
	root, err := filepath.Abs(cgroupDir(dir))
	if err != nil {
		return err
	}
	if mounted, _ := mountsUnder(root); !slices.Contains(mounted, root) {
		tmp, err := os.MkdirTemp("", NSPrefix+"cgroup2-")
		if err != nil {
			return err
		}
		defer os.Remove(tmp)
		if err := unix.Mount("cgroup2", tmp, "cgroup2", 0, ""); err != nil {
			return nil
		}
		defer unix.Unmount(tmp, unix.MNT_DETACH)
		root = tmp
	}
	groups, _ := filepath.Glob(filepath.Join(root, NSPrefix+"*"))
	var errs []error
	for _, g := range groups {
		// cgroup.kill SIGKILLs the whole subtree; the lab's processes were
		// stopped gracefully before, these are strays.
		_ = os.WriteFile(filepath.Join(g, "cgroup.kill"), []byte("1"), 0)
		if err := removeCgroupTree(g); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeCgroupTree removes a cgroup and its descendants, deepest first.
func removeCgroupTree(g string) error {
	entries, _ := os.ReadDir(g)
	for _, e := range entries {
		if e.IsDir() {
			if err := removeCgroupTree(filepath.Join(g, e.Name())); err != nil {
				return err
			}
		}
	}
	// A process that was just killed may still be leaving it.
	err := unix.Rmdir(g)
	for deadline := time.Now().Add(5 * time.Second); errors.Is(err, unix.EBUSY) && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		err = unix.Rmdir(g)
	}
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("removing cgroup %s: %w", g, err)
	}
	return nil
}

// mountsUnder lists the mount points at or below dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) > 1 && (fields[1] == abs || strings.HasPrefix(fields[1], abs+"/")) {
			out = append([]string{fields[1]}, out...)
		}
	}
	return out, s.Err()
}

// DialFunc opens connections, as net.Dialer.DialContext does.
type DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// Dialer opens connections from the lab namespace at nsPath as a process
// there would: in the eBPF mode, sockets of a node's or its pods'
// namespaces are made in the node's cgroup (netnsutil.CgroupDialer), so
// that the node's socket programs see them; elsewhere they are made in the
// namespace only. A program using it calls netnsutil.ServeDialHelper
// first (tests do through netnsutil.RunTests).
func (st *State) Dialer(nsPath string) DialFunc {
	if node := st.nodeOf(nsPath); node != "" && st.ProxyMode == "ebpf" {
		return netnsutil.CgroupDialer(nsPath, st.nodeCgroup(node))
	}
	return netnsutil.Dialer(nsPath, nil)
}

// nodeOf is the node a namespace path belongs to ("" for other members):
// a node's namespace, or a pod's, /proc/PID/ns/net of a process in the
// node's cgroup root (lab.State.PodNetNS).
func (st *State) nodeOf(nsPath string) string {
	if pid, ok := strings.CutSuffix(strings.TrimPrefix(nsPath, "/proc/"), "/ns/net"); ok {
		b, _ := os.ReadFile("/proc/" + pid + "/cgroup")
		for _, m := range NodeMembers(st.Members) {
			if inNodeCgroup(string(b), m.Name) {
				return m.Name
			}
		}
		return ""
	}
	for _, m := range NodeMembers(st.Members) {
		if m.NSPath() == nsPath {
			return m.Name
		}
	}
	return ""
}
