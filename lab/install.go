package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/weftnet/weft/deploy"
	"github.com/weftnet/weft/internal/ociimage"
	"github.com/weftnet/weft/internal/proc"
	"github.com/weftnet/weft/lab/kubelet"
)

// The lab installs weft the way users do: it applies deploy/ (the overlay
// of its proxy mode, plus the lab's own settings) with kubectl, and the
// mini-kubelets run the DaemonSet's and the Deployment's pods from weft's
// image. A node's file system is a directory (NodeRoot): the kubelet maps
// the machine paths a node has its own of (/etc/cni/net.d, /opt/cni/bin,
// /var/lib/weft, /run/xtables.lock, and for eBPF /sys/fs/bpf and
// /sys/fs/cgroup) to it, in hostPath volumes and in the CNI configuration
// the agent writes, so that the plugins the init container installs, the
// configuration the agent writes and the IPAM state the plugin and the
// agent share meet where they would on a real node.

// ImageArchive is the image `make image` builds, in the lab's bin dir.
const ImageArchive = "weft-image.oci.tar"

// ClusterDNS is the cluster DNS Service's address (deploy/dns), and
// KubernetesServiceIP the kubernetes Service's.
const (
	ClusterDNS          = "10.96.0.10"
	KubernetesServiceIP = "10.96.0.1"
)

// WeftImage is the repository of weft's image in deploy/; the lab's
// kubelets run its tags from local binaries (kubelet.Options.BinDir,
// ImagesDir).
const WeftImage = kubelet.ImageRepo

// NodeRoot is a node's own file system, bound over the machine's paths
// in the node's mount namespace.
func NodeRoot(dir, node string) string { return filepath.Join(NodeDir(dir, node), "root") }

// imageRoot is where weft's image is unpacked: next to the archive, once
// per build of it (the labs share it; containers see it read-only but for
// their mount points).
func imageRoot(binDir string) string { return filepath.Join(binDir, "weft-image.rootfs") }

// ImagesDir holds binaries standing for other tags of weft's image
// (ImagesDir/<tag>/weft-agent, ...): an upgrade test puts a build there
// and sets the DaemonSet's image to that tag.
func ImagesDir(dir string) string { return filepath.Join(dir, "images") }

// nodePaths are the machine paths a node has its own of.
var nodePaths = []string{"/etc/cni/net.d", "/opt/cni/bin", "/var/lib/weft", "/run/xtables.lock"}

// KubeletOptions are the mini-kubelet's settings on a node.
func (st *State) KubeletOptions(node Member) kubelet.Options {
	nd, root := NodeDir(st.Dir, node.Name), NodeRoot(st.Dir, node.Name)
	o := kubelet.Options{
		Node: node.Name, NodeIP: node.IP, Kubeconfig: filepath.Join(st.Dir, node.Name+"-kubelet.kubeconfig"),
		StateDir: nd, NSPrefix: NSPrefix,
		CNIConfDir: filepath.Join(root, "etc/cni/net.d"), CNIBinDir: filepath.Join(root, "opt/cni/bin"),
		WorkloadBin: filepath.Join(st.BinDir, "weft-workload"),
		BinDir:      st.BinDir, ImagesDir: ImagesDir(st.Dir), ImageRoot: imageRoot(st.BinDir),
		Shim:           []string{filepath.Join(st.BinDir, "weftctl"), "lab", "container"},
		APIServiceHost: KubernetesServiceIP,
		ClusterDNS:     ClusterDNS, ClusterDomain: "cluster.local",
		HostPaths: map[string]string{},
	}
	if st.Racks > 1 {
		o.Labels = map[string]string{RackLabel: strconv.Itoa(node.Rack)}
	}
	for _, p := range nodePaths {
		o.HostPaths[p] = filepath.Join(root, p)
	}
	if st.ProxyMode == "ebpf" {
		o.HostPaths["/sys/fs/bpf"] = filepath.Join(bpffsDir(st.Dir), node.Name)
		o.HostPaths["/sys/fs/cgroup"] = st.nodeCgroup(node.Name)
	}
	return o
}

// prepareNodes makes each node's directories.
func prepareNodes(o Options, nodes []Member) error {
	for _, n := range nodes {
		for _, p := range []string{"etc/cni/net.d", "opt/cni/bin", "var/lib/weft", "run"} {
			if err := os.MkdirAll(filepath.Join(NodeRoot(o.Dir, n.Name), p), 0o755); err != nil {
				return err
			}
		}
		if o.ProxyMode == "ebpf" {
			if err := os.MkdirAll(filepath.Join(bpffsDir(o.Dir), n.Name), 0o700); err != nil {
				return err
			}
		}
	}
	return nil
}

// unpackImage unpacks weft's image next to its archive unless this build
// of it is unpacked already (the archive's size and time are recorded).
func unpackImage(binDir string) error {
	archive := filepath.Join(binDir, ImageArchive)
	st, err := os.Stat(archive)
	if err != nil {
		return fmt.Errorf("weft's image: %w (run `make image`)", err)
	}
	root := imageRoot(binDir)
	stamp := fmt.Sprintf("%d %d\n", st.Size(), st.ModTime().UnixNano())
	if b, err := os.ReadFile(root + ".stamp"); err == nil && string(b) == stamp {
		return os.Chmod(root, 0o755) // a container's / (an older lab made it 0700)
	}
	tmp, err := os.MkdirTemp(binDir, ".weft-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if _, _, err := ociimage.Unpack(archive, tmp); err != nil {
		return fmt.Errorf("unpacking %s: %w", archive, err)
	}
	// It is the containers' /: every user must reach what is below.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	// Replace the old root (removed first: rename does not replace a
	// directory that has entries), then record the build.
	_ = os.Remove(root + ".stamp")
	if err := os.RemoveAll(root); err != nil {
		return err
	}
	if err := os.Rename(tmp, root); err != nil {
		return err
	}
	return os.WriteFile(root+".stamp", []byte(stamp), 0o644)
}

// writeKustomization writes deploy/ into the lab dir, and the lab's
// overlay (deploy-lab) on top of the proxy mode's: the lab's routing and resync, and
// the API server's address for pods on the node's network (the
// weft-apiserver ConfigMap docs/deploy.md describes).
func writeKustomization(o Options) (string, error) {
	root := filepath.Join(o.Dir, "deploy")
	err := fs.WalkDir(deploy.Files, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := deploy.Files.ReadFile(p)
		if err != nil {
			return err
		}
		dst := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		return os.WriteFile(dst, b, 0o644)
	})
	if err != nil {
		return "", err
	}
	base := "../deploy"
	if o.ProxyMode != "iptables" {
		base = "../deploy/overlays/" + o.ProxyMode
	}
	overlay := fmt.Sprintf(`# The lab's install: deploy/ as users apply it, with the lab's settings.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - %s
configMapGenerator:
  - name: weft-agent-config
    namespace: weft-system
    behavior: merge
    literals:
      - routing=%s
      - resync=10s
  - name: weft-apiserver
    namespace: weft-system
    options:
      disableNameSuffixHash: true
    literals:
      - KUBERNETES_SERVICE_HOST=%s
      - KUBERNETES_SERVICE_PORT=%d
`, base, o.Routing, ControlIP, APIServerPort)
	dir := filepath.Join(o.Dir, "deploy-lab")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if o.Routing == "bgp" {
		if overlay, err = writeBGP(o, dir, overlay); err != nil {
			return "", err
		}
	}
	return dir, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(overlay), 0o644)
}

// writeBGP adds to the lab's overlay what deploy/overlays/bgp adds to the
// base (its RBAC, agent settings and the agent's port capability; the overlays of the proxy modes and
// of bgp each include the base, so the lab composes them itself), and the
// lab's BGP configuration: on racks, every node peers with its rack's ToR
// (selected by the node's rack label) with the ToR's MD5 password from a
// Secret, and Services' external and load-balancer IPs are announced.
func writeBGP(o Options, dir, overlay string) (string, error) {
	rbac, err := deploy.Files.ReadFile("overlays/bgp/bgp-rbac.yaml")
	if err != nil {
		return "", err
	}
	var conf strings.Builder
	fmt.Fprintf(&conf, "asn: %d\nannounce:\n  externalIPs: true\n  loadBalancerIPs: true\n", clusterASN)
	if o.Racks > 1 {
		conf.WriteString("peers:\n")
		for r := range o.Racks {
			fmt.Fprintf(&conf, `  - name: tor-rack%d
    address: %s
    asn: %d
    families: [ipv4]
    holdTimeSeconds: 9
    keepaliveSeconds: 3
    passwordSecret: {name: weft-bgp-tor, key: password}
    nodeSelector: {%s: "%d"}
`, r, ToRAddr(r), ToRASN, RackLabel, r)
		}
	}
	port, err := deploy.Files.ReadFile("overlays/bgp/agent-bgp-port.yaml")
	if err != nil {
		return "", err
	}
	files := map[string]string{"bgp-rbac.yaml": string(rbac), "agent-bgp-port.yaml": string(port), "bgp-config.yaml": conf.String()}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(b), 0o644); err != nil {
			return "", err
		}
	}
	overlay = strings.Replace(overlay, "resources:\n", "resources:\n  - bgp-rbac.yaml\n", 1)
	overlay = strings.Replace(overlay, "      - routing=bgp\n", "      - routing=bgp\n      - bgp-config=weft-system/weft-bgp\n", 1)
	return overlay + fmt.Sprintf(`  - name: weft-bgp
    namespace: weft-system
    options:
      disableNameSuffixHash: true
    files:
      - config.yaml=bgp-config.yaml
patches:
  - path: agent-bgp-port.yaml
    target:
      kind: DaemonSet
      name: weft-agent
secretGenerator:
  - name: weft-bgp-tor
    namespace: weft-system
    options:
      disableNameSuffixHash: true
    literals:
      - password=%s
`, torPassword), nil
}

// Kubectl runs the lab's kubectl with the admin kubeconfig.
func Kubectl(ctx context.Context, st *State, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(st.BinDir, "kubectl"), append([]string{"--kubeconfig", AdminKubeconfig(st.Dir)}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return out, nil
}

// install applies the lab's kustomization.
func install(ctx context.Context, st *State) error {
	dir, err := writeKustomization(st.Options)
	if err != nil {
		return err
	}
	_, err = Kubectl(ctx, st, "apply", "-k", dir)
	return err
}

// WaitAgents waits until weft-agent's DaemonSet has rolled out: every
// node runs an up-to-date agent pod that is ready.
func WaitAgents(ctx context.Context, c kubernetes.Interface, nodes int) error {
	for {
		ds, err := c.AppsV1().DaemonSets("weft-system").Get(ctx, "weft-agent", metav1.GetOptions{})
		if err == nil && rolledOut(ds, nodes) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("weft-agent DaemonSet not rolled out on %d nodes (status %+v): %w", nodes, dsStatus(ds), ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func rolledOut(ds *appsv1.DaemonSet, nodes int) bool {
	s := ds.Status
	return s.ObservedGeneration >= ds.Generation && int(s.DesiredNumberScheduled) == nodes &&
		int(s.UpdatedNumberScheduled) == nodes && int(s.NumberAvailable) == nodes && s.NumberUnavailable == 0
}

func dsStatus(ds *appsv1.DaemonSet) any {
	if ds == nil {
		return "absent"
	}
	return ds.Status
}

// WaitServiceAccount waits until namespace ns has its default service
// account: the API server refuses pods in a namespace until the
// controller-manager made it.
func WaitServiceAccount(ctx context.Context, c kubernetes.Interface, ns string) error {
	for {
		_, err := c.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("namespace %s has no default service account: %w", ns, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// agentRun is what a node's kubelet recorded of its weft-agent pod.
type agentRun struct {
	Name       string `json:"name"`
	Namespace  string `json:"namespace"`
	Containers []struct {
		Name string `json:"name"`
		PID  int    `json:"pid"`
	} `json:"containers"`
}

// miniAgentPID is the pid of the weft-agent container on node, from its
// mini-kubelet's state.
func miniAgentPID(dir, node string) (int, bool) {
	files, _ := filepath.Glob(filepath.Join(NodeDir(dir, node), "pods", "*.json"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var r agentRun
		if json.Unmarshal(b, &r) != nil || r.Namespace != "weft-system" || !strings.HasPrefix(r.Name, "weft-agent-") {
			continue
		}
		for _, c := range r.Containers {
			if c.Name == "agent" && proc.Running(c.PID) {
				return c.PID, true
			}
		}
	}
	return 0, false
}
