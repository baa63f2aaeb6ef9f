package lab

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/weftnet/weft/deploy"
)

// The lab installs weft the way users do: it applies deploy/ (the overlay
// of its proxy mode, plus the lab's own settings) with kubectl, and the
// nodes' kubelets run the DaemonSet's and the Deployment's pods from
// weft's image, imported into each node's containerd.

// ImageArchive is the image `make image` builds, in the lab's bin dir.
const ImageArchive = "weft-image.oci.tar"

// ClusterDNS is the cluster DNS Service's address (deploy/dns), and
// KubernetesServiceIP the kubernetes Service's.
const (
	ClusterDNS          = "10.96.0.10"
	KubernetesServiceIP = "10.96.0.1"
)

// WeftImage is the repository of weft's image in deploy/.
const WeftImage = "ghcr.io/weftnet/weft"

// NodeRoot is a node's own file system, bound over the machine's paths
// in the node's mount namespace.
func NodeRoot(dir, node string) string { return filepath.Join(NodeDir(dir, node), "root") }

// nodePaths are the machine paths a node has its own of: its pods'
// hostPath volumes (deploy/'s DaemonSet) meet the runtime's CNI plugins
// and configuration and the plugin's IPAM state there.
var nodePaths = []string{"/etc/cni/net.d", "/opt/cni/bin", "/var/lib/weft", "/run/xtables.lock"}

// writeKustomization writes deploy/ into the lab dir, and the lab's
// overlay (deploy-lab) on top of the proxy mode's: the lab's routing and resync, and
// the API server's address for pods on the node's network (the
// weft-apiserver ConfigMap docs/deploy.md describes).
func writeKustomization(o Options, literals ...string) (string, error) {
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
      - policy-log-drops=true
      - cluster-cidr=%s%s
  - name: weft-apiserver
    namespace: weft-system
    options:
      disableNameSuffixHash: true
    literals:
      - KUBERNETES_SERVICE_HOST=%s
      - KUBERNETES_SERVICE_PORT=%d
`, base, o.Routing, o.clusterCIDRs(), extraLiterals(literals), ControlIP, APIServerPort)
	if o.Encryption == "wireguard" {
		overlay = strings.Replace(overlay, "configMapGenerator:\n", "components:\n  - ../deploy/components/wireguard\nconfigMapGenerator:\n", 1)
	}
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

// install applies the lab's kustomization, after the CRDs in the bin
// directory's crds/ (ClusterNetworkPolicy's, which make build copies from
// the network-policy-api module), as an operator installs them first.
func install(ctx context.Context, st *State, literals ...string) error {
	if err := installCRDs(ctx, st); err != nil {
		return err
	}
	dir, err := writeKustomization(st.Options, literals...)
	if err != nil {
		return err
	}
	_, err = Kubectl(ctx, st, "apply", "-k", dir)
	return err
}

// installCRDs applies bin/crds/ (nothing when it does not exist) and waits
// until the API server serves what it defines.
func installCRDs(ctx context.Context, st *State) error {
	dir := filepath.Join(st.BinDir, "crds")
	if _, err := os.Stat(dir); os.IsNotExist(err) {
		return nil
	}
	if _, err := Kubectl(ctx, st, "apply", "--server-side", "-f", dir); err != nil {
		return err
	}
	// kubectl wait fails at once while a new CRD has no status yet: ask
	// again until it is established.
	var err error
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(time.Second) {
		if _, err = Kubectl(ctx, st, "wait", "--for", "condition=Established", "--timeout", "10s", "-f", dir); err == nil {
			return nil
		}
	}
	return err
}

// Reinstall applies the lab's install again with more agent settings
// (KEY=VALUE literals of the agent's ConfigMap, such as proxy-mode=iptables
// on an eBPF lab), as an operator changing the ConfigMap would: the
// agents roll.
func (st *State) Reinstall(ctx context.Context, literals ...string) error {
	return install(ctx, st, literals...)
}

// extraLiterals lays literals out as more lines of the ConfigMap
// generator's list.
func extraLiterals(literals []string) string {
	var b strings.Builder
	for _, l := range literals {
		b.WriteString("\n      - " + l)
	}
	return b.String()
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
