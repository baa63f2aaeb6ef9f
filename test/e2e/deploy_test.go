package e2e

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/weftnet/weft/lab"
)

// deployDryRun: the API server accepts every kustomization in deploy/
// (base and overlays) as it stands, with strict field validation: what
// `kubectl apply -k` would create is valid against the real schemas and
// admission.
func deployDryRun(t *testing.T, c *cluster) {
	bin := binDir(t)
	root := filepath.Dir(bin)
	for _, dir := range []string{"deploy", "deploy/overlays/cni-only", "deploy/overlays/ebpf", "deploy/overlays/nftables", "deploy/overlays/bgp"} {
		out, err := exec.Command(filepath.Join(bin, "kubectl"), "--kubeconfig", lab.AdminKubeconfig(c.dir),
			"apply", "--dry-run=server", "--validate=strict", "-k", filepath.Join(root, dir)).CombinedOutput()
		if err != nil {
			t.Errorf("kubectl apply --dry-run=server -k %s: %v\n%s", dir, err, out)
			continue
		}
		for _, want := range []string{"daemonset.apps/weft-agent", "configmap/weft-agent-config-"} {
			if !strings.Contains(string(out), want) {
				t.Errorf("%s: the dry run did not include %s:\n%s", dir, want, out)
			}
		}
	}
}
