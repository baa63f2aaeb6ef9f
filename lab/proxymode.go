package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/netnsutil"
)

// ProxyModes are the service proxy backends a lab's agents can run.
var ProxyModes = []string{"iptables", "nftables", "ebpf"}

// The eBPF mode's socket programs act on the processes of one cgroup: each
// lab node gets its own (NSPrefix + node name) in the cgroup v2 hierarchy,
// holding its agent, its kubelet and so every pod the kubelet starts; the
// pinned maps and links live on a bpffs. The lab mounts both in its
// directory (the cgroup v2 hierarchy is the machine's one, seen through a
// mount of its own), and Down removes the cgroups and the mounts.

// nodeCgroup is a node's cgroup, "" outside the eBPF mode.
func (o Options) nodeCgroup(node string) string {
	if o.ProxyMode != "ebpf" {
		return ""
	}
	return filepath.Join(cgroupDir(o.Dir), NSPrefix+node)
}

// cgroupDir and bpffsDir are where the lab mounts cgroup2 and a bpffs.
func cgroupDir(dir string) string { return filepath.Join(dir, "cgroup2") }
func bpffsDir(dir string) string  { return filepath.Join(dir, "bpffs") }

// prepareProxyMode makes what the agents' proxy mode needs on the host:
// for eBPF, the nodes' cgroups and the bpffs.
func prepareProxyMode(o Options, nodes []Member) error {
	if o.ProxyMode != "ebpf" {
		return nil
	}
	for fstype, dir := range map[string]string{"cgroup2": cgroupDir(o.Dir), "bpf": bpffsDir(o.Dir)} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		if err := unix.Mount(fstype, dir, fstype, 0, ""); err != nil {
			return fmt.Errorf("--proxy-mode ebpf: mounting %s on %s: %w", fstype, dir, err)
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
	var errs []error
	groups, _ := filepath.Glob(filepath.Join(cgroupDir(dir), NSPrefix+"*"))
	for _, g := range groups {
		// A process that was just killed may still be leaving it.
		err := unix.Rmdir(g)
		for deadline := time.Now().Add(5 * time.Second); errors.Is(err, unix.EBUSY) && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
			err = unix.Rmdir(g)
		}
		if err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("removing cgroup %s: %w", g, err))
		}
	}
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

// proxyArgs are the agent's proxy flags on a node.
func (o Options) proxyArgs(node string) []string {
	args := []string{"--proxy-mode", o.ProxyMode}
	if o.ProxyMode == "ebpf" {
		args = append(args, "--cgroup-root", o.nodeCgroup(node), "--bpf-pin-path", filepath.Join(bpffsDir(o.Dir), node))
	}
	return args
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
	name, _ := strings.CutPrefix(filepath.Base(nsPath), NSPrefix)
	node, _, _ := strings.Cut(name, "-")
	for _, m := range NodeMembers(st.Members) {
		if m.Name == node {
			return netnsutil.CgroupDialer(nsPath, st.nodeCgroup(node))
		}
	}
	return netnsutil.Dialer(nsPath, nil)
}
