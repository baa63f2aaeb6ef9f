package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
)

// A real lab node is what a cluster's node runs: the upstream kubelet and
// containerd with runc, calling weft's CNI plugin for every pod. Each node
// is three lab daemons in the node's network namespace:
//
//   - <node>-ns holds the node's mount namespace (`unshare --mount`, a
//     slave of the machine's, shared inside so that the kubelet's volume
//     mounts reach runc) and UTS namespace (the node's host name): it mounts the node's /sys and cgroup hierarchies
//     (mountCgroups), binds the node's own directories over the machine
//     paths a node has its own of (nodeBinds) and waits;
//   - <node>-containerd and <node>-kubelet enter those namespaces
//     (`nsenter`, enterNode), so both see the same files, mounts and pod
//     network namespaces, with every path of their own under the node's
//     directory (NodeRoot).
//
// The kubelet runs on the machine's cgroup v1 hierarchies under a cgroup
// root of the node's (/weftlab-<node> in each), and the node's daemons in
// the node's cgroup v2 directory, which is the node's
// /sys/fs/cgroup/unified (the eBPF mode's socket programs attach there,
// never to the machine's root cgroup).

// nodeBin is where hack/build-node.sh puts containerd, its shim, ctr and
// pause.
func nodeBin(binDir string) string { return filepath.Join(binDir, "node") }

// runcPath is Debian's runc (hack/install-deps.sh).
const runcPath = "/usr/sbin/runc"

// TestImagesDir holds the images every real node imports besides weft's:
// pause, the e2e suite's and the lab workload's (make node).
func TestImagesDir(binDir string) string { return filepath.Join(binDir, "images") }

// kubeletSysctls are the host-wide kernel settings the kubelet writes at
// start (they are not per namespace): Up records them before the first
// kubelet starts and Down puts them back.
var kubeletSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

// nodeBind is a machine path bound to a node's own file in its mount
// namespace.
type nodeBind struct {
	Target, Source string
	File           bool
}

// nodeBinds are the binds of a node's mount namespace: the paths its
// pods' hostPath volumes name (deploy/'s DaemonSet), the kubelet's, and
// the node's own bpffs directory (in every mode: the agent of any mode
// looks there for what an eBPF mode left, never at the machine's).
func (o Options) nodeBinds(node string) []nodeBind {
	root := NodeRoot(o.Dir, node)
	var b []nodeBind
	for _, p := range nodePaths {
		b = append(b, nodeBind{Target: p, Source: filepath.Join(root, p), File: p == "/run/xtables.lock"})
	}
	// The kubelet's and containerd's own directories at their usual
	// paths: the unix sockets they make there must fit in a socket
	// address (108 bytes), which the node's directory may not.
	for _, p := range []string{"/var/lib/kubelet", "/var/log/pods", "/var/log/containers", "/run/containerd"} {
		b = append(b, nodeBind{Target: p, Source: filepath.Join(root, p)})
	}
	return append(b, nodeBind{Target: "/sys/fs/bpf", Source: NodeBPFFS(o.Dir, node)})
}

// MachinePaths are the machine's paths a lab's nodes bind their own
// directories over (and which lab up makes if the machine lacks them).
func MachinePaths(o Options) []string {
	var out []string
	for _, b := range o.nodeBinds(NodeName(0)) {
		out = append(out, b.Target)
	}
	return out
}

// KubeletSysctls are the host-wide kernel settings the kubelets change
// and lab down puts back, as /proc/sys paths.
func KubeletSysctls() []string {
	out := make([]string, len(kubeletSysctls))
	for i, s := range kubeletSysctls {
		out[i] = "/proc/sys/" + s
	}
	return out
}

// createdPaths records the mount points the lab had to create on the
// machine for its nodes' binds (Down removes them).
func createdPaths(dir string) string { return filepath.Join(dir, "created-paths") }

// makeMountPoints creates the targets of the nodes' binds that the machine
// lacks, recording each path it made.
func makeMountPoints(o Options) error {
	var created []string
	defer func() { _ = os.WriteFile(createdPaths(o.Dir), []byte(strings.Join(created, "\n")), 0o644) }()
	for _, b := range o.nodeBinds(NodeName(0)) {
		if _, err := os.Stat(b.Target); errors.Is(err, os.ErrNotExist) {
			if err := makeMountPoint(b.Target, b.File, &created); err != nil {
				return err
			}
		}
	}
	return nil
}

// NodeNamespace is `weftctl lab node-ns`: run in a new mount namespace
// (unshare --mount --propagation slave), it makes the namespace's mounts
// shared, mounts the node's /sys and cgroups, makes the kubelet's cgroup
// root, binds the node's directories, writes the ready file and waits for
// SIGTERM. The namespace lives on in the node's daemons.
func NodeNamespace(o Options, node string) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SHARED, ""); err != nil {
		return fmt.Errorf("making / shared: %w", err)
	}
	// The node's host name (its own UTS namespace), which its hostNetwork
	// pods share, as on a real machine.
	if err := unix.Sethostname([]byte(node)); err != nil {
		return fmt.Errorf("the node's host name: %w", err)
	}
	// The node's own /sys (its network devices) and cgroup hierarchies,
	// whatever mount namespace the lab was started from.
	if err := unix.Mount("sysfs", "/sys", "sysfs", 0, ""); err != nil {
		return fmt.Errorf("the node's /sys: %w", err)
	}
	dirs, err := mountCgroups("/sys/fs/cgroup", o.nodeCgroup(node))
	if err != nil {
		return err
	}
	if err := makeKubeletCgroups(node, dirs); err != nil {
		return err
	}
	for _, b := range o.nodeBinds(node) {
		if err := unix.Mount(b.Source, b.Target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding %s over %s: %w", b.Source, b.Target, err)
		}
	}
	if err := os.WriteFile(nsReady(o.Dir, node), nil, 0o644); err != nil {
		return err
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	return nil
}

// makeMountPoint creates path (a directory, or an empty file) and the
// directories above it that are missing, recording each it made.
func makeMountPoint(path string, file bool, created *[]string) error {
	var missing []string
	for p := filepath.Dir(path); p != "/"; p = filepath.Dir(p) {
		if _, err := os.Stat(p); err == nil {
			break
		}
		missing = append([]string{p}, missing...)
	}
	for _, p := range missing {
		if err := os.Mkdir(p, 0o755); err != nil {
			return fmt.Errorf("mount point %s: %w", path, err)
		}
		*created = append(*created, p)
	}
	var err error
	if file {
		err = os.WriteFile(path, nil, 0o600)
	} else {
		err = os.Mkdir(path, 0o755)
	}
	if err != nil {
		return fmt.Errorf("mount point %s: %w", path, err)
	}
	*created = append(*created, path)
	return nil
}

func nsReady(dir, node string) string { return filepath.Join(NodeDir(dir, node), "ns-ready") }

// containerdSocket is the node's containerd API socket, in the node's
// mount namespace; from outside it is containerdSocketFile.
const containerdSocket = "/run/containerd/containerd.sock"

func containerdSocketFile(dir, node string) string {
	return filepath.Join(NodeRoot(dir, node), containerdSocket)
}

// containerdConfig is the node's containerd configuration: every path its
// own, its CNI configuration and plugins where the node's agent and
// install-cni put them, pods' network namespaces under its state
// directory, runc's cgroupfs driver, and the sandbox image pinned (the
// images are imported: there is no registry).
func (o Options) containerdConfig(node string) string {
	root := NodeRoot(o.Dir, node)
	p := func(rel string) string { return strconv.Quote(filepath.Join(root, rel)) }
	// root and state come before any table: under a table they would
	// belong to it, and containerd would fall back to the machine's
	// /var/lib/containerd.
	return fmt.Sprintf(`version = 3
root = %s
state = %q
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing", "io.containerd.nri.v1.nri"]

[grpc]
  address = %q

[ttrpc]
  address = %q

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  # No CAP_SYS_RESOURCE here: runc may not lower a process's OOM score.
  restrict_oom_score_adj = true
  # Pods' network namespaces are the node's: under its state directory,
  # not the machine's /run/netns.
  netns_mounts_under_state_dir = true
  tolerate_missing_hugetlb_controller = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = %q
        Root = %s
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [%s]
    conf_dir = %s
    max_conf_num = 1

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = %q

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins."io.containerd.internal.v1.opt"]
  path = %s
`, p("var/lib/containerd"), filepath.Dir(containerdSocket),
		containerdSocket, containerdSocket+".ttrpc",
		runcPath, p("run/runc"), p("opt/cni/bin"), p("etc/cni/net.d"), PauseImage, p("opt/containerd"))
}

// PauseImage is the pod sandbox image (the kubelet's and containerd's
// default for Kubernetes 1.36).
const PauseImage = "registry.k8s.io/pause:3.10.2"

// kubeletCgroupRoot is the node's cgroup root in every v1 hierarchy.
func kubeletCgroupRoot(node string) string { return "/" + NSPrefix + node }

// kubeletConfig is the node's KubeletConfiguration: on cgroup v1 with the
// cgroupfs driver under the node's cgroup root, no eviction or image
// garbage collection (the images were imported and cannot be pulled
// again), webhook authentication and authorization, the node's own
// directories.
func (o Options) kubeletConfig(node Member) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: %s
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
containerRuntimeEndpoint: unix://%s
address: %s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %s}
authorization:
  mode: Webhook
clusterDNS: [%s]
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
failSwapOn: false
protectKernelDefaults: false
evictionHard: {memory.available: "0%%", nodefs.available: "0%%", nodefs.inodesFree: "0%%", imagefs.available: "0%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
maxPods: 110
nodeStatusUpdateFrequency: 4s
syncFrequency: 10s
fileCheckFrequency: 20s
volumeStatsAggPeriod: 0s
localStorageCapacityIsolation: false
`, kubeletCgroupRoot(node.Name), containerdSocket, node.IP,
		filepath.Join(o.Dir, "pki", "ca.crt"), ClusterDNS)
}

// prepareNode makes a node's directories (the sources of its binds
// among them) and configuration files.
func prepareNode(o Options, n Member) error {
	root := NodeRoot(o.Dir, n.Name)
	for _, d := range []string{"etc/cni/net.d", "opt/cni/bin", "var/lib/weft", "var/lib/kubelet", "var/log/containers", "var/log/pods",
		"var/lib/containerd", "run/containerd", "run/runc", "etc/containerd", "etc/kubernetes", "opt/containerd"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(NodeBPFFS(o.Dir, n.Name), 0o700); err != nil {
		return err
	}
	files := map[string]string{
		"etc/containerd/config.toml":  o.containerdConfig(n.Name),
		"etc/kubernetes/kubelet.yaml": o.kubeletConfig(n),
		"run/xtables.lock":            "",
	}
	for rel, content := range files {
		if err := os.WriteFile(filepath.Join(root, rel), []byte(content), 0o644); err != nil {
			return err
		}
	}
	// The loopback plugin is the node's, as a distribution ships it with
	// the runtime: containerd wires every pod's lo with it.
	return copyExecutable(filepath.Join(o.BinDir, "cni", "loopback"), filepath.Join(root, "opt/cni/bin/loopback"))
}

func copyExecutable(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o755)
}

// v1Hierarchy is one of the machine's cgroup v1 hierarchies: the mount
// options that name it and its usual directory under /sys/fs/cgroup.
type v1Hierarchy struct{ opts, dir string }

// v1Hierarchies lists the machine's cgroup v1 hierarchies from
// /proc/self/cgroup, which every mount namespace sees alike (a test's
// private /sys hides /sys/fs/cgroup, so its mounts are not where to look).
func v1Hierarchies() ([]v1Hierarchy, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	return parseV1Hierarchies(string(b)), nil
}

// parseV1Hierarchies reads the v1 hierarchies of a /proc/PID/cgroup.
func parseV1Hierarchies(procCgroup string) []v1Hierarchy {
	var out []v1Hierarchy
	for _, line := range strings.Split(strings.TrimSpace(procCgroup), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 || f[1] == "" {
			continue // the v2 hierarchy
		}
		h := v1Hierarchy{opts: f[1], dir: f[1]}
		if name, ok := strings.CutPrefix(f[1], "name="); ok {
			h.opts, h.dir = "none,"+f[1], name
		}
		out = append(out, h)
	}
	return out
}

// mountCgroups mounts, under root (a tmpfs it mounts first), every v1
// hierarchy at its usual directory and the node's cgroup v2 directory as
// "unified": a real node's /sys/fs/cgroup, as the kubelet and runc expect
// it on a hybrid machine. It returns the v1 mount points.
func mountCgroups(root, unified string) ([]string, error) {
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "mode=755"); err != nil {
		return nil, fmt.Errorf("tmpfs on %s: %w", root, err)
	}
	hs, err := v1Hierarchies()
	if err != nil {
		return nil, err
	}
	var dirs []string
	for _, h := range hs {
		d := filepath.Join(root, h.dir)
		if err := os.Mkdir(d, 0o755); err != nil {
			return nil, err
		}
		if err := unix.Mount("cgroup", d, "cgroup", 0, h.opts); err != nil {
			return nil, fmt.Errorf("cgroup v1 hierarchy %s on %s: %w", h.opts, d, err)
		}
		dirs = append(dirs, d)
	}
	if unified != "" {
		d := filepath.Join(root, "unified")
		if err := os.Mkdir(d, 0o755); err != nil {
			return nil, err
		}
		if err := unix.Mount(unified, d, "", unix.MS_BIND, ""); err != nil {
			return nil, fmt.Errorf("binding %s on %s: %w", unified, d, err)
		}
	}
	return dirs, nil
}

// makeKubeletCgroups creates the node's cgroup root in every v1 hierarchy
// mounted at dirs (the kubelet requires it to exist), with the cpuset's
// CPUs and memory nodes of the parent.
func makeKubeletCgroups(node string, dirs []string) error {
	for _, h := range dirs {
		g := filepath.Join(h, kubeletCgroupRoot(node))
		if err := os.Mkdir(g, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("node %s's cgroup root: %w", node, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if v, err := os.ReadFile(filepath.Join(h, f)); err == nil {
				if err := os.WriteFile(filepath.Join(g, f), v, 0o644); err != nil {
					return fmt.Errorf("%s: %w", filepath.Join(g, f), err)
				}
			}
		}
	}
	return nil
}

// removeKubeletCgroups removes every lab cgroup root of the v1
// hierarchies, killing what is left in them, seen through a temporary
// mount of each.
func removeKubeletCgroups() error {
	tmp, err := os.MkdirTemp("", NSPrefix+"cgroup1-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	dirs, err := mountCgroups(tmp, "")
	defer func() {
		for _, d := range dirs {
			_ = unix.Unmount(d, unix.MNT_DETACH)
		}
		_ = unix.Unmount(tmp, unix.MNT_DETACH)
	}()
	if err != nil {
		return err
	}
	var errs []error
	for _, h := range dirs {
		groups, _ := filepath.Glob(filepath.Join(h, NSPrefix+"*"))
		for _, g := range groups {
			killCgroupV1(g)
			if err := removeCgroupTree(g); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// killCgroupV1 SIGKILLs every process of a v1 cgroup and its descendants.
func killCgroupV1(g string) {
	_ = filepath.WalkDir(g, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		b, _ := os.ReadFile(p)
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		return nil
	})
}

// sysctlsRecord holds the machine's values of the settings the kubelets
// change. It is the machine's, not a lab directory's: a lab killed
// without `lab down` leaves the kubelets' values behind, and the next lab
// (in another directory) must not take those for the machine's. It lives
// on /run, so a reboot, which resets the settings, drops it too.
var sysctlsRecord = "/run/weft-lab-machine-sysctls"

// recordSysctls saves the machine's values of kubeletSysctls, unless a
// record exists (an earlier lab's, not yet restored, holds the originals).
func recordSysctls() error {
	if _, err := os.Stat(sysctlsRecord); err == nil {
		return nil
	}
	var b strings.Builder
	for _, s := range kubeletSysctls {
		v, err := os.ReadFile("/proc/sys/" + s)
		if err != nil {
			continue // a setting this kernel lacks
		}
		fmt.Fprintf(&b, "%s %s\n", s, strings.TrimSpace(string(v)))
	}
	return os.WriteFile(sysctlsRecord, []byte(b.String()), 0o644)
}

// restoreSysctls writes the recorded settings back and drops the record.
func restoreSysctls() error {
	b, err := os.ReadFile(sysctlsRecord)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		name, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		if err := os.WriteFile("/proc/sys/"+name, []byte(value), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restoring %s: %w", name, err))
		}
	}
	if len(errs) == 0 {
		errs = append(errs, os.Remove(sysctlsRecord))
	}
	return errors.Join(errs...)
}

// removeCreatedPaths removes the mount points the lab made on the
// machine, deepest first, if they are still empty.
func removeCreatedPaths(dir string) {
	b, err := os.ReadFile(createdPaths(dir))
	if err != nil {
		return
	}
	paths := strings.Fields(string(b))
	for i := len(paths) - 1; i >= 0; i-- {
		_ = os.Remove(paths[i]) // fails, and stays, if something else put files there
	}
}

// nodeNSDaemon is the holder of a node's mount namespace.
func (o Options) nodeNSDaemon(n Member, weftctl string) Proc {
	return Proc{Name: n.Name + "-ns", NS: n.NSPath(), Cgroup: o.nodeCgroup(n.Name), Args: []string{
		"unshare", "--mount", "--uts", "--propagation", "slave", "--",
		weftctl, "lab", "node-ns", "--dir", o.Dir, "--node", n.Name,
	}}
}

// enterNode is the command prefix that runs a program in the mount and
// UTS namespaces of a node, whose holder process is holder.
func enterNode(holder int) []string {
	ns := "/proc/" + strconv.Itoa(holder) + "/ns/"
	return []string{"nsenter", "--mount=" + ns + "mnt", "--uts=" + ns + "uts", "--"}
}

// inNodeMounts are the daemons that enter the node's mount namespace.
func (o Options) inNodeMounts(n Member, holder int) []Proc {
	enter := enterNode(holder)
	root := NodeRoot(o.Dir, n.Name)
	path := "PATH=" + nodeBin(o.BinDir) + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	kubelet := []string{filepath.Join(o.BinDir, "kubelet"),
		"--config", filepath.Join(root, "etc/kubernetes/kubelet.yaml"),
		"--kubeconfig", filepath.Join(o.Dir, n.Name+"-kubelet.kubeconfig"),
		"--hostname-override", n.Name, "--node-ip", n.nodeIPs(), "--v", "1",
	}
	// Each node is a zone of its own, or Zones zones, a rack of nodes one
	// zone: the upstream suite's topology specs need three zones (some
	// with two nodes each), and the proxy follows zone hints only on a
	// node with a zone.
	labels := ZoneLabel + "=zone-" + n.Name
	if i, err := strconv.Atoi(strings.TrimPrefix(n.Name, "node")); err == nil && o.Zones > 0 {
		labels = ZoneLabel + "=zone-" + strconv.Itoa((i-1)%o.Zones+1)
	}
	if o.Racks > 1 {
		labels = RackLabel + "=" + strconv.Itoa(n.Rack) + "," + ZoneLabel + "=rack-" + strconv.Itoa(n.Rack)
	}
	kubelet = append(kubelet, "--node-labels", labels)
	return []Proc{
		{Name: n.Name + "-containerd", NS: n.NSPath(), Cgroup: o.nodeCgroup(n.Name), Env: []string{path},
			Args: append(enter, filepath.Join(nodeBin(o.BinDir), "containerd"), "--config", filepath.Join(root, "etc/containerd/config.toml"))},
		{Name: n.Name + "-kubelet", NS: n.NSPath(), Cgroup: o.nodeCgroup(n.Name), Env: []string{path},
			Args: append(enter, kubelet...)},
	}
}

// startRealNodes brings up every node's mount namespace, containerd (with
// the images imported) and kubelet.
func startRealNodes(ctx context.Context, o Options, nodes []Member) error {
	weftctl := filepath.Join(o.BinDir, "weftctl")
	for _, n := range nodes {
		if err := prepareNode(o, n); err != nil {
			return err
		}
	}
	if err := recordSysctls(); err != nil {
		return err
	}
	if err := makeMountPoints(o); err != nil {
		return err
	}
	type result struct {
		took string
		err  error
	}
	results := make(chan result, len(nodes))
	for _, n := range nodes {
		go func() {
			took, err := startRealNode(ctx, o, n, weftctl)
			results <- result{took, err}
		}()
	}
	var errs []error
	for range nodes {
		r := <-results
		if r.err != nil {
			errs = append(errs, r.err)
			continue
		}
		fmt.Fprintf(o.Out, "         %s\n", r.took)
	}
	return errors.Join(errs...)
}

// startRealNode starts one node and says how long its parts took.
func startRealNode(ctx context.Context, o Options, n Member, weftctl string) (string, error) {
	begin := time.Now()
	holder, err := start(o.Dir, o.nodeNSDaemon(n, weftctl))
	if err != nil {
		return "", err
	}
	if err := waitFile(ctx, o.Dir, nsReady(o.Dir, n.Name), n.Name+"-ns"); err != nil {
		return "", err
	}
	procs := o.inNodeMounts(n, holder)
	if _, err := start(o.Dir, procs[0]); err != nil {
		return "", err
	}
	if err := waitFile(ctx, o.Dir, containerdSocketFile(o.Dir, n.Name), procs[0].Name); err != nil {
		return "", err
	}
	serving := time.Now()
	if err := importImages(ctx, o, n.Name); err != nil {
		return "", err
	}
	imported := time.Now()
	if _, err := start(o.Dir, procs[1]); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s: mounts and containerd %.1fs, images imported %.1fs", n.Name,
		serving.Sub(begin).Seconds(), imported.Sub(serving).Seconds()), nil
}

// waitFile waits until path exists, or fails naming the daemon and its
// log once the daemon has died.
func waitFile(ctx context.Context, dir, path, daemon string) error {
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if _, ok := alive(dir, daemon); !ok {
			return fmt.Errorf("%s exited (see %s):\n%s", daemon, logPath(dir, daemon), tail(logPath(dir, daemon), 8))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not make %s (see %s): %w", daemon, path, logPath(dir, daemon), ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// importImages imports weft's image and the test images into the node's
// containerd (namespace k8s.io, where the CRI plugin looks).
func importImages(ctx context.Context, o Options, node string) error {
	archives, _ := filepath.Glob(filepath.Join(TestImagesDir(o.BinDir), "*.oci.tar"))
	archives = append([]string{filepath.Join(o.BinDir, ImageArchive)}, archives...)
	for _, a := range archives {
		// containerd makes its socket file (bind) a moment before it
		// listens: a first connection may be refused.
		for try := 0; ; try++ {
			out, err := o.ctr(ctx, node, "images", "import", a).CombinedOutput()
			if err == nil {
				break
			}
			if try >= 20 || !strings.Contains(string(out), "connection refused") || ctx.Err() != nil {
				return fmt.Errorf("node %s: importing %s: %w: %s", node, filepath.Base(a), err, out)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	return nil
}

// ctr is the node's ctr command on the CRI plugin's namespace, run in the
// node's mount namespace (the socket's full path from outside may be too
// long for a socket address).
func (o Options) ctr(ctx context.Context, node string, args ...string) *exec.Cmd {
	holder, _ := alive(o.Dir, node+"-ns")
	argv := append(enterNode(holder), filepath.Join(nodeBin(o.BinDir), "ctr"), "--address", containerdSocket, "-n", "k8s.io")
	return exec.CommandContext(ctx, argv[0], append(argv[1:], args...)...)
}

// PodNetNS is the path of a running pod's network namespace: that of a
// process of the pod, found by its cgroup, which the kubelet names after
// the pod's UID (the pod's sandbox lives as long as the pod).
func (st *State) PodNetNS(p *corev1.Pod) (string, error) {
	if p.Spec.NodeName == "" || p.Status.PodIP == "" {
		return "", fmt.Errorf("pod %s/%s is not running on a node yet", p.Namespace, p.Name)
	}
	want := "/pod" + string(p.UID) + "/"
	pid, ok := findProcess(func(_ int, cgroup string) bool { return strings.Contains(cgroup, want) })
	if !ok {
		return "", fmt.Errorf("pod %s/%s: no process of it on %s", p.Namespace, p.Name, p.Spec.NodeName)
	}
	return fmt.Sprintf("/proc/%d/ns/net", pid), nil
}
