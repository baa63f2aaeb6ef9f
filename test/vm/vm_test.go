package vm

import (
	"bytes"
	"cmp"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weftnet/weft/lab"
)

// suites are the kernel test binaries the VM runs: a name, the package,
// the tests it runs there (a -run pattern; "" is all) and those it leaves
// out (a -skip pattern), each said why. A suite with bench set runs those
// benchmarks instead, and only when WEFT_VM_SUITES names it (make bench).
var suites = []struct{ name, pkg, run, skip, bench string }{
	// The guest's own checks (TestGuest).
	{"vm", "./test/vm", "", "", ""},
	// The IPVS backend on a kernel with IPVS (its pure tests run on the host).
	{"ipvs", "./proxy/ipvs", "TestScenarios|TestKernelTable", "", ""},
	// The iptables backend's shared scenarios on Debian stable's kernel.
	{"iptables", "./proxy/iptables", "TestScenarios", "", ""},
	// The eBPF backend's, but for the termination of a connected UDP
	// socket whose backend left (removed, or moved to another port): it
	// needs bpf_sock_destroy (Linux 6.5), which 6.1 lacks, and the backend
	// documents that such sockets then stay on the removed backend until
	// the client closes them. The DSR scenarios (TestScenariosDSR, about
	// a minute in the guest) load the same program; they run here when
	// WEFT_VM_RUN names them.
	{"ebpf", "./proxy/ebpf", "^TestScenarios$", "TestScenarios/^(UDPBackendReplaced|UDPTargetPortChanged)$", ""},
	// The other backends run the whole table on the host, but for the
	// bonded and VLAN uplinks: that kernel cannot make those links.
	{"nftables", "./proxy/nftables", "TestScenarios/Uplinks", "", ""},
	{"userspace", "./proxy/userspace", "TestScenarios/.*/Uplinks", "", ""},
	// Encryption between nodes with the kernel's WireGuard, which this
	// machine's kernel lacks (the userspace implementation runs on the
	// host); the guest's environment makes a missing kernel device a
	// failure, not a skip.
	{"wireguard", "./routing/wireguard", "", "", ""},
	// IPIP routing, which needs the ipip module (required there too).
	{"ipip", "./routing", "IPIP", "", ""},
	// The NetworkPolicy backends' scenarios with SCTP probes beside TCP and
	// UDP: this machine's kernel has no SCTP, so only here do SCTP rules
	// meet SCTP packets (WEFT_SCTP_KERNEL makes a kernel without it a
	// failure). About 1.5 and 2 minutes in the guest; the random policy
	// tests (TestRandom, TestRandomTiers: SCTP too) pass there as well but
	// would add 5 more, so they run only when WEFT_VM_RUN names them.
	{"policy-iptables", "./policy/iptables", "^TestScenarios$", "", ""},
	{"policy-nftables", "./policy/nftables", "^TestScenarios$", "", ""},
	// Pod-to-pod throughput and connection rate with the kernel's
	// WireGuard beside host-gw and VXLAN (under emulation: the ratios
	// only mean something).
	{"wireguard-bench", "./routing/wireguard", "", "", "PodToPod"},
}

// bootTimeout bounds one boot: a hung guest fails the test with its console.
const bootTimeout = 12 * time.Minute

// TestVM boots the pinned Debian kernel under qemu and runs the kernel
// test suites inside; each suite is a subtest that fails with the guest's
// output when the suite failed there.
func TestVM(t *testing.T) {
	if os.Getenv(GuestEnv) != "" {
		t.Skip("in the guest: TestVM runs on the host")
	}
	if testing.Short() {
		t.Skip("boots a VM: not -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("kernel test: needs root")
	}
	root := repoRoot(t)
	cache := filepath.Join(root, "bin", "vm")
	k, err := FetchKernel(cache)
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	g := Guest{
		Tools: tools(t, "ip", "nft", "ipset", "iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"),
		Files: map[string]string{"/weft/cni/weft": build(t, root, work, "weft-cni", "build", "./cmd/weft-cni"),
			// ipset reads protocol names from /etc/protocols.
			"/etc/protocols": "/etc/protocols", "/etc/services": "/etc/services"},
		Env: map[string]string{"WEFT_CNI_PATH": "/weft/cni", "WEFT_WIREGUARD_KERNEL": "required", "WEFT_IPIP_KERNEL": "required",
			"WEFT_SCTP_KERNEL": "required"},
		// Networking and netfilter (IPVS among them), the virtual links the
		// tests make (bonds and VLANs for the uplink scenarios, which this
		// machine's kernel cannot make), sock_diag for TCP (the reset
		// aborts a client on the node by SOCK_DESTROY), and the VM's
		// entropy source; SCTP and its iptables match for the policy
		// suites.
		ModuleDirs: []string{"kernel/net", "kernel/drivers/net/veth.ko", "kernel/drivers/net/dummy.ko",
			"kernel/drivers/net/bonding", "kernel/drivers/char/hw_random", "kernel/drivers/net/wireguard", "kernel/drivers/net/vxlan"},
		Load: []string{"virtio-rng", "veth", "dummy", "bridge", "br_netfilter", "bonding", "8021q", "ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_lc", "ip_vs_sh", "ip_vs_mh",
			"nf_tables", "nf_conntrack", "nf_nat", "inet_diag", "tcp_diag", "wireguard", "ipip", "vxlan",
			"sctp", "xt_sctp"},
	}
	// WEFT_VM_SUITES (comma-separated names) and WEFT_VM_RUN (a -run
	// pattern) narrow a run while working on one suite.
	only, run := os.Getenv("WEFT_VM_SUITES"), os.Getenv("WEFT_VM_RUN")
	// iptables' extensions, which it loads at run time, with their
	// libraries.
	ext, err := filepath.Glob(filepath.Join(xtables, "*.so"))
	if err != nil || len(ext) == 0 {
		t.Fatalf("no iptables extensions in %s (%v)", xtables, err)
	}
	g.Tools = append(g.Tools, ext...)
	for _, s := range suites {
		named := slices.Contains(strings.Split(only, ","), s.name)
		if only != "" && !named || s.bench != "" && !named {
			continue
		}
		args := []string{"-test.v", "-test.count=1", "-test.timeout=" + (bootTimeout - time.Minute).String()}
		if s.bench != "" {
			args = append(args, "-test.run=^$", "-test.bench="+s.bench, "-test.benchtime=10x")
		}
		if r := cmp.Or(run, s.run); r != "" {
			args = append(args, "-test.run="+r)
		}
		if s.skip != "" {
			args = append(args, "-test.skip="+s.skip)
		}
		g.Binaries = append(g.Binaries, Binary{Name: s.name, Path: build(t, root, work, s.name+".test", "test", "-c", s.pkg),
			Args: args})
	}
	initrd := filepath.Join(work, "initramfs.gz")
	if err := Initramfs(k, g, initrd); err != nil {
		t.Fatal(err)
	}
	// The VM takes the machine's lab turn: beside a lab's load the
	// emulated guest runs several times slower, and the scenarios' one
	// second requests would time out.
	turnCtx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	done, err := lab.WaitTurn(turnCtx)
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	var console bytes.Buffer
	res, err := Boot(context.Background(), k, initrd, g, bootTimeout, &console)
	_ = os.WriteFile(filepath.Join(cache, "console.log"), console.Bytes(), 0o644)
	for _, r := range res {
		t.Run(r.Name, func(t *testing.T) {
			t.Log(r.Output)
			switch r.Code {
			case 0:
			case -1:
				t.Errorf("%s did not finish in the guest", r.Name)
			default:
				t.Errorf("%s failed in the guest (exit %d); its output is above", r.Name, r.Code)
			}
		})
	}
	if err != nil {
		t.Fatal(err)
	}
}

// build runs go with args (building out into dir) as a static binary,
// since the guest has no C library of its own.
func build(t *testing.T, root, dir, out string, args ...string) string {
	t.Helper()
	path := filepath.Join(dir, out)
	cmd := exec.Command("go", append(append(args[:1:1], "-o", path), args[1:]...)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if o, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v: %s", strings.Join(args, " "), err, o)
	}
	return path
}

// xtables is where Debian's iptables keeps its extensions.
const xtables = "/usr/lib/x86_64-linux-gnu/xtables"

// tools are the host paths of the tools the guest's tests call.
func tools(t *testing.T, names ...string) []string {
	t.Helper()
	var out []string
	for _, name := range names {
		p, err := exec.LookPath(name)
		if err != nil {
			t.Fatalf("the guest needs %s from the host (make deps installs it): %v", name, err)
		}
		out = append(out, p)
	}
	return out
}

func repoRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// TestGuest checks, in the VM only, that the guest is what the suites
// expect: the pinned kernel, with IPVS loaded.
func TestGuest(t *testing.T) {
	if os.Getenv(GuestEnv) == "" {
		t.Skip("runs in the VM (TestVM boots it)")
	}
	rel, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(rel)); got != KernelRelease() {
		t.Fatalf("the guest runs %s, want %s", got, KernelRelease())
	}
	if _, err := os.Stat("/proc/net/ip_vs"); err != nil {
		t.Fatalf("no IPVS in the guest: %v", err)
	}
}
