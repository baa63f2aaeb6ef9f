package image

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/weftnet/weft/internal/iptmode"
	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/internal/ociimage"
)

func TestMain(m *testing.M) { os.Exit(netnsutil.RunTests(m)) }

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// deployedContainers are the containers of the DaemonSet and Deployment
// users install.
func deployedContainers(t *testing.T, root string) []corev1.Container {
	t.Helper()
	var out []corev1.Container
	for _, f := range []string{"deploy/agent/agent.yaml", "deploy/dns/dns.yaml"} {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range strings.Split(string(data), "\n---\n") {
			obj, _, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			switch o := obj.(type) {
			case *appsv1.DaemonSet:
				out = append(out, o.Spec.Template.Spec.InitContainers...)
				out = append(out, o.Spec.Template.Spec.Containers...)
			case *appsv1.Deployment:
				out = append(out, o.Spec.Template.Spec.Containers...)
			}
		}
	}
	return out
}

// TestImage unpacks the image `make image` built (bin/weft-image.oci.tar),
// checks that it holds this build's binaries, and runs from its root
// filesystem every program the manifests start and every tool weft-agent
// executes, for real, in the test's own network namespace.
func TestImage(t *testing.T) {
	if !netnsutil.Isolated() {
		t.Skip("needs root: the image's programs run chrooted in a private network and mount namespace")
	}
	root := repoRoot(t)
	archive := filepath.Join(root, "bin", "weft-image.oci.tar")
	if _, err := os.Stat(archive); err != nil {
		t.Fatalf("%v: run make image first", err)
	}
	rootfs := filepath.Join(t.TempDir(), "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	name, cfg, err := ociimage.Unpack(archive, rootfs)
	if err != nil {
		t.Fatal(err)
	}
	if name == "" || len(cfg.RootFS.DiffIDs) != 2 {
		t.Fatalf("image %q with %d layers", name, len(cfg.RootFS.DiffIDs))
	}
	for from, to := range Binaries {
		want, err := os.ReadFile(filepath.Join(root, "bin", from))
		if err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(filepath.Join(rootfs, to)); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("/%s in the image is not bin/%s of this build (%v): run make image", to, from, err)
		}
	}
	for _, m := range []string{"proc", "dev"} {
		target := filepath.Join(rootfs, m)
		if err := unix.Mount("/"+m, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			t.Fatal(err)
		}
		defer unix.Unmount(target, unix.MNT_DETACH)
	}
	path := ""
	for _, e := range cfg.Config.Env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			path = v
		}
	}
	run := func(t *testing.T, stdin string, env []string, argv ...string) string {
		t.Helper()
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: rootfs}
		cmd.Dir = "/"
		cmd.Env = append([]string{"PATH=" + path}, env...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s in the image: %v\n%s", strings.Join(argv, " "), err, out)
		}
		return string(out)
	}

	t.Run("manifests", func(t *testing.T) {
		for _, c := range deployedContainers(t, root) {
			argv := c.Command
			switch c.Name {
			case "sysctls":
				// For real: the settings of this test's own network
				// namespace.
			case "install-cni":
				if err := os.MkdirAll(filepath.Join(rootfs, "host/opt/cni/bin"), 0o755); err != nil {
					t.Fatal(err)
				}
			default:
				// Daemons: their command line parses; -help stops them
				// before they reach for the API server.
				argv = append(argv[:len(argv):len(argv)], "-help")
			}
			run(t, "", nil, argv...)
		}
		if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); err != nil || strings.TrimSpace(string(b)) != "1" {
			t.Errorf("the sysctls init container did not set ip_forward: %q %v", b, err)
		}
		for _, p := range []string{"weft", "weft-plugin", "portmap"} {
			if _, err := os.Stat(filepath.Join(rootfs, "host/opt/cni/bin", p)); err != nil {
				t.Errorf("install-cni did not install %s: %v", p, err)
			}
		}
		out := run(t, "", []string{"CNI_COMMAND=VERSION"}, "/host/opt/cni/bin/weft")
		if !strings.Contains(out, "supportedVersions") {
			t.Errorf("the installed plugin answered VERSION with %q", out)
		}
	})
	sbin := filepath.Join(rootfs, iptmode.SbinDir)
	linkedTo := func(t *testing.T) map[string]bool {
		t.Helper()
		targets := map[string]bool{}
		for _, n := range iptmode.Names {
			dest, err := os.Readlink(filepath.Join(sbin, n))
			if err != nil {
				t.Fatal(err)
			}
			targets[dest] = true
		}
		return targets
	}
	t.Run("iptables mode of a legacy node", func(t *testing.T) {
		// The node's kubelet runs legacy iptables: its hint chain is there.
		run(t, "", nil, "xtables-legacy-multi", "iptables", "-t", "mangle", "-N", "KUBE-IPTABLES-HINT")
		if out := run(t, "", nil, "iptables-save", "-t", "mangle"); !strings.Contains(out, ":KUBE-IPTABLES-HINT") {
			t.Errorf("the wrapper did not run the legacy variant: iptables-save shows\n%s", out)
		}
		if got := linkedTo(t); len(got) != 1 || !got[iptmode.Legacy.Binary()] {
			t.Errorf("after the first call the iptables names point at %v, want only %s", got, iptmode.Legacy.Binary())
		}
		// Back to the image's state for the next case.
		run(t, "", nil, "xtables-legacy-multi", "iptables", "-t", "mangle", "-X", "KUBE-IPTABLES-HINT")
		for _, n := range iptmode.Names {
			p := filepath.Join(sbin, n)
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(wrapper, p); err != nil {
				t.Fatal(err)
			}
		}
	})
	t.Run("agent tools", func(t *testing.T) {
		run(t, "*nat\n:WEFT-IMAGE-TEST - [0:0]\n-A WEFT-IMAGE-TEST -d 10.96.0.1/32 -j RETURN\nCOMMIT\n", nil, "iptables-restore", "--noflush")
		if out := run(t, "", nil, "iptables-save", "-t", "nat"); !strings.Contains(out, "-A WEFT-IMAGE-TEST -d 10.96.0.1/32 -j RETURN") {
			t.Errorf("iptables-save does not show the restored rule:\n%s", out)
		}
		run(t, "*filter\n:WEFT-IMAGE-TEST - [0:0]\n-A WEFT-IMAGE-TEST -s fd00::1/128 -j DROP\nCOMMIT\n", nil, "ip6tables-restore", "--noflush")
		run(t, "", nil, "ip6tables", "-S", "WEFT-IMAGE-TEST")
		run(t, "", nil, "ipset", "create", "weft-image-test", "hash:net,port")
		run(t, "", nil, "ipset", "add", "weft-image-test", "10.244.1.0/24,tcp:80")
		if out := run(t, "", nil, "ipset", "list", "weft-image-test"); !strings.Contains(out, "10.244.1.0/24,tcp:80") {
			t.Errorf("ipset list:\n%s", out)
		}
		if out := run(t, "", nil, "nft", "list", "ruleset"); !strings.Contains(out, "WEFT-IMAGE-TEST") {
			t.Errorf("nft does not see the iptables-nft chain:\n%s", out)
		}
		run(t, "", nil, "conntrack", "-L")
		// A node with no rules anywhere: nf_tables, as current distributions.
		if got := linkedTo(t); len(got) != 1 || !got[iptmode.NFT.Binary()] {
			t.Errorf("the iptables names point at %v, want only %s", got, iptmode.NFT.Binary())
		}
	})
}
