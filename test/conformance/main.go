// Command conformance runs an upstream suite against weft: the Kubernetes
// e2e suite's [sig-network] specs (-suite e2e, the default), or the
// network-policy-api conformance suite (-suite network-policy-api). For
// each service-proxy mode it brings up a lab (whose nodes run the upstream
// kubelet, containerd and runc), runs the suite from the lab's external
// host (bin/ginkgo with bin/e2e.test, or bin/npapi-conformance.test),
// tears the lab down, and finally writes a summary of the results. See
// docs/conformance.md.
//
//	go run ./test/conformance [-suite e2e|network-policy-api] [-modes iptables,nftables,ebpf]
//	                          [-focus RE] [-skip RE] [-conformance-only] [-nodes 3] [-procs 2]
//	                          [-timeout 3h] [-out bin/conformance] [-bin bin] [-dir DIR] [-keep]
//
// The exit status is 0 only if every mode's lab came up and every selected
// spec passed; the last line of the output is the verdict.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/lab"
)

// Selections of the suite (see docs/conformance.md and skips.go).
const (
	defaultFocus = `\[sig-network\]`
	// The CI selection, -conformance-only.
	conformanceFocus = `\[sig-network\].*\[Conformance\]`
	conformanceSkip  = `\[Serial\]|SCTP`
)

// labDirBase holds the labs' directories when -dir is not given.
const labDirBase = "/var/lib/weft-lab-conformance"

// upTimeout bounds one lab's start (real nodes import their images).
const upTimeout = 20 * time.Minute

type config struct {
	suite         string
	modes         []string
	focus, skip   string
	nodes, procs  int
	zones         int
	timeout       time.Duration
	out, bin, dir string
	keep          bool
	dualStack     bool
	routing       string
	encryption    string
	// noSCTP: the lab's nodes have no SCTP (the policy suite's -no-sctp).
	noSCTP bool
}

func main() {
	// lab's eBPF mode dials through helper processes of this program.
	netnsutil.ServeDialHelper()
	os.Exit(run(os.Args[1:]))
}

func parseFlags(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("conformance", flag.ContinueOnError)
	modes := os.Getenv("CONFORMANCE_MODES")
	if modes == "" {
		modes = strings.Join(lab.ProxyModes, ",")
	}
	fs.StringVar(&c.suite, "suite", suiteE2E, "the suite: "+suiteE2E+" (Kubernetes [sig-network]) or "+suiteNPAPI+" (ClusterNetworkPolicy; default modes "+strings.Join(npapiModes, ",")+", one per policy backend)")
	modeList := fs.String("modes", modes, "comma-separated service proxy modes, one lab each ($CONFORMANCE_MODES sets the default)")
	fs.StringVar(&c.focus, "focus", defaultFocus, "ginkgo focus regexp (-suite "+suiteNPAPI+": go test's -run, default all)")
	fs.StringVar(&c.skip, "skip", defaultSkip(), "ginkgo skip regexp; the default leaves out what this lab cannot run (docs/conformance.md) (-suite "+suiteNPAPI+": go test's -skip, default none)")
	conformanceOnly := fs.Bool("conformance-only", false, "the CI selection: focus "+conformanceFocus+", skip "+conformanceSkip+" (an explicit -focus or -skip still wins)")
	fs.IntVar(&c.nodes, "nodes", 3, "lab nodes")
	fs.IntVar(&c.zones, "zones", 0, "spread the nodes over that many zones (0: each node its own); the Traffic Distribution specs want 3 zones of 2 nodes: -nodes 6 -zones 3")
	fs.IntVar(&c.procs, "procs", 2, "parallel ginkgo processes")
	fs.DurationVar(&c.timeout, "timeout", 3*time.Hour, "ginkgo's timeout for one mode's suite")
	fs.StringVar(&c.out, "out", "bin/conformance", "results directory: <out>/<mode>/ (ginkgo.log, junit_01.xml or npapi.log, npapi.json; lab logs) and <out>/summary.md (-suite "+suiteNPAPI+": default bin/conformance-policy)")
	fs.StringVar(&c.bin, "bin", "bin", "directory of e2e.test, ginkgo, kubectl and the lab's binaries")
	fs.StringVar(&c.dir, "dir", "", "lab directory (default: a new directory under "+labDirBase+")")
	fs.BoolVar(&c.keep, "keep", false, "leave the last mode's lab up")
	fs.BoolVar(&c.dualStack, "dual-stack", true, "dual-stack labs (IPv4 and IPv6), for the [Feature:IPv6DualStack] specs")
	fs.StringVar(&c.routing, "routing", "hostgw", "the labs' routing mode: hostgw or vxlan")
	fs.StringVar(&c.encryption, "encryption", "none", "the labs' encryption between nodes: none or wireguard")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch c.suite {
	case suiteE2E:
	case suiteNPAPI:
		if *conformanceOnly {
			return c, errors.New("-conformance-only: only for -suite " + suiteE2E)
		}
		if !set["focus"] {
			c.focus = ""
		}
		if !set["skip"] {
			c.skip = ""
		}
		if !set["modes"] && os.Getenv("CONFORMANCE_MODES") == "" {
			*modeList = strings.Join(npapiModes, ",")
		}
		if !set["out"] {
			c.out = "bin/conformance-policy"
		}
	default:
		return c, fmt.Errorf("-suite: %q is neither %s nor %s", c.suite, suiteE2E, suiteNPAPI)
	}
	if *conformanceOnly {
		if !set["focus"] {
			c.focus = conformanceFocus
		}
		if !set["skip"] {
			c.skip = conformanceSkip
		}
	}
	for m := range strings.SplitSeq(*modeList, ",") {
		if m = strings.TrimSpace(m); m != "" {
			c.modes = append(c.modes, m)
		}
	}
	if len(c.modes) == 0 {
		return c, errors.New("-modes: no mode")
	}
	if c.nodes < 1 || c.procs < 1 {
		return c, errors.New("-nodes and -procs must be at least 1")
	}
	var err error
	for _, p := range []*string{&c.out, &c.bin} {
		if *p, err = filepath.Abs(*p); err != nil {
			return c, err
		}
	}
	return c, nil
}

func run(args []string) int {
	c, err := parseFlags(args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		return 2
	}
	if err := preflight(&c); err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		fmt.Println("FAIL: " + err.Error())
		return 1
	}
	// The first SIGINT or SIGTERM interrupts ginkgo and tears the lab
	// down; later ones are ignored until that is done.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	fmt.Printf("conformance: waiting for the machine's lab turn\n")
	done, err := lab.WaitTurn(ctx)
	if err != nil {
		fmt.Printf("FAIL: %v\n", err)
		return 1
	}
	defer done()

	var results []Result
	for i, mode := range c.modes {
		if ctx.Err() != nil {
			results = append(results, Result{Mode: mode, Err: errors.New("not run: interrupted")})
			continue
		}
		results = append(results, runMode(ctx, c, mode, c.keep && i == len(c.modes)-1))
	}

	sel := Selection{Suite: c.suite, Focus: c.focus, Skip: c.skip, Nodes: c.nodes, Procs: c.procs, ResultsDir: c.out, NoSCTP: c.noSCTP}
	if c.suite == suiteE2E {
		sel.Version = stampedVersion(c.bin, ".e2e-version")
	} else {
		sel.Version = stampedVersion(c.bin, ".npapi-version")
	}
	summary := Summary(sel, results)
	if err := os.WriteFile(filepath.Join(c.out, "summary.md"), []byte(summary), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "conformance: writing the summary:", err)
	}
	fmt.Print("\n" + summary)
	if _, ok := Verdict(results); !ok {
		return 1
	}
	return 0
}

// preflight checks what the run needs before any lab is made.
func preflight(c *config) error {
	if os.Geteuid() != 0 {
		return errors.New("the lab needs root")
	}
	for _, m := range c.modes {
		if !slices.Contains(lab.ProxyModes, m) {
			return fmt.Errorf("-modes: %q is not one of %v", m, lab.ProxyModes)
		}
	}
	if c.suite == suiteNPAPI {
		if err := npapiPreflight(c); err != nil {
			return err
		}
		return os.MkdirAll(c.out, 0o755)
	}
	for _, b := range []string{"e2e.test", "ginkgo", "kubectl"} {
		if _, err := os.Stat(filepath.Join(c.bin, b)); err != nil {
			return fmt.Errorf("%s missing: `make conformance` builds it", filepath.Join(c.bin, b))
		}
	}
	return os.MkdirAll(c.out, 0o755)
}

// runMode brings up one lab, runs the suite against it and takes the lab
// down again (not when keep is set, unless interrupted).
func runMode(ctx context.Context, c config, mode string, keep bool) (res Result) {
	res.Mode = mode
	begin := time.Now()
	defer func() { res.Duration = time.Since(begin) }()
	out := filepath.Join(c.out, mode)
	// A report left by an earlier run must not be read as this run's.
	if err := os.RemoveAll(out); err != nil {
		res.Err = err
		return res
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		res.Err = err
		return res
	}
	dir := c.dir
	if dir == "" {
		if err := os.MkdirAll(labDirBase, 0o755); err != nil {
			res.Err = err
			return res
		}
		var err error
		if dir, err = os.MkdirTemp(labDirBase, "lab-"); err != nil {
			res.Err = err
			return res
		}
	}

	fmt.Printf("==> %s: lab up in %s (%d nodes, upstream kubelet)\n", mode, dir, c.nodes)
	upLog, err := os.Create(filepath.Join(out, "lab-up.log"))
	if err != nil {
		res.Err = err
		return res
	}
	defer upLog.Close()
	upCtx, cancel := context.WithTimeout(ctx, upTimeout)
	err = lab.Up(upCtx, lab.Options{
		Nodes: c.nodes, Zones: c.zones, Routing: c.routing, Encryption: c.encryption, ProxyMode: mode, DualStack: c.dualStack,
		Dir: dir, BinDir: c.bin, APIPort: lab.APIServerPort, Out: io.MultiWriter(os.Stdout, upLog),
	})
	cancel()
	if err != nil {
		// Up has removed what it made.
		res.Err = fmt.Errorf("lab up: %w", err)
		return res
	}
	defer func() {
		if keep && ctx.Err() == nil {
			fmt.Printf("==> %s: lab kept: KUBECONFIG=%s; `bin/weftctl lab down --dir %s` removes it\n", mode, lab.AdminKubeconfig(dir), dir)
			return
		}
		copyLogs(filepath.Join(dir, "logs"), filepath.Join(out, "lab-logs"))
		fmt.Printf("==> %s: lab down\n", mode)
		if err := lab.Down(dir); err != nil {
			res.Err = errors.Join(res.Err, fmt.Errorf("lab down: %w", err))
		}
	}()

	kubeconfig := lab.UnderlayKubeconfig(dir)
	var suiteRes Result
	if c.suite == suiteNPAPI {
		fmt.Printf("==> %s: %s, log in %s\n", mode, npapiTest, filepath.Join(out, "npapi.log"))
		suiteRes = runNPAPI(ctx, c, mode, kubeconfig, out)
	} else {
		fmt.Printf("==> %s: ginkgo, log in %s\n", mode, filepath.Join(out, "ginkgo.log"))
		suiteRes = runE2E(ctx, c, mode, kubeconfig, out)
	}
	res = suiteRes
	res.Mode = mode
	return res
}

// runE2E runs ginkgo with e2e.test and reads its JUnit report.
func runE2E(ctx context.Context, c config, mode, kubeconfig, out string) (res Result) {
	runErr := runGinkgo(ctx, c, mode, kubeconfig, out)

	junit := filepath.Join(out, "junit_01.xml")
	parsed, err := parseFile(junit)
	switch {
	case err != nil && runErr != nil:
		res.Err = fmt.Errorf("ginkgo: %v, and no report: %v", runErr, err)
		return res
	case err != nil:
		res.Err = err
		return res
	}
	res = parsed
	switch {
	case runErr != nil && len(res.FailedSpecs) == 0:
		// An interrupt, a timeout, or a crash the report does not name.
		res.Err = fmt.Errorf("ginkgo: %v (see %s)", runErr, filepath.Join(out, "ginkgo.log"))
	case res.Run == 0:
		res.Err = errors.New("the focus and skip selected no spec")
	}
	return res
}

// runGinkgo runs the suite from the lab's external host, its output to
// <out>/ginkgo.log and one line per finished spec to stdout.
func runGinkgo(ctx context.Context, c config, mode, kubeconfig, out string) error {
	log, err := os.Create(filepath.Join(out, "ginkgo.log"))
	if err != nil {
		return err
	}
	defer log.Close()
	args := []string{
		"--procs=" + fmt.Sprint(c.procs), "--timeout=" + c.timeout.String(),
		// -v: a block per finished spec (progress reads it), with its
		// timeline; no color in the log.
		"-v", "--no-color",
	}
	if c.focus != "" {
		args = append(args, "--focus="+c.focus)
	}
	if c.skip != "" {
		args = append(args, "--skip="+c.skip)
	}
	args = append(args, filepath.Join(c.bin, "e2e.test"), "--",
		"--kubeconfig="+kubeconfig,
		"--kubectl-path="+filepath.Join(c.bin, "kubectl"),
		"--provider=local",
		// The node count, as a provider's config gives it: specs that
		// need several nodes skip themselves without it.
		"--num-nodes="+fmt.Sprint(c.nodes),
		// junit_01.xml, a short JUnit report of every spec.
		"--report-dir="+out,
		"--e2e-output-dir="+out,
		"--disable-log-dump",
	)
	// ginkgo stops at its own timeout; this is a bound against a hang.
	runCtx, cancel := context.WithTimeout(ctx, c.timeout+10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(runCtx, filepath.Join(c.bin, "ginkgo"), args...)
	w := io.MultiWriter(log, newProgress(mode, os.Stdout))
	cmd.Stdout, cmd.Stderr = w, w
	// ginkgo compares its version with the one `go list -m` gives in the
	// suite's directory (bin/, under weft's go.mod, not hack/tools' which
	// built e2e.test) and warns of a mismatch that is not there.
	cmd.Env = append(os.Environ(), "GO111MODULE=off")
	// Its own process group: a terminal's ^C reaches this program only,
	// which interrupts ginkgo once (ginkgo then reports and cleans up).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 3 * time.Minute
	fmt.Fprintf(log, "# %s\n", strings.Join(cmd.Args, " "))
	// The process and its children live in the external host's network
	// namespace, where the API server and the nodes are on the underlay.
	if err := netnsutil.Do(netnsutil.RunDir+"/"+lab.ExternalNS, cmd.Start); err != nil {
		return err
	}
	return cmd.Wait()
}

func parseFile(path string) (Result, error) {
	f, err := os.Open(path)
	if err != nil {
		return Result{}, err
	}
	defer f.Close()
	res, err := ParseJUnit(f)
	if err != nil {
		return res, fmt.Errorf("%s: %w", path, err)
	}
	return res, nil
}

// copyLogs keeps the lab's daemon logs (Down removes the lab directory).
func copyLogs(from, to string) {
	entries, err := os.ReadDir(from)
	if err != nil {
		return
	}
	if err := os.MkdirAll(to, 0o755); err != nil {
		return
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(from, e.Name())); err == nil {
			_ = os.WriteFile(filepath.Join(to, e.Name()), b, 0o644)
		}
	}
}

// stampedVersion reads the version a build script stamped: the second field of
// bin/.e2e-version ("k8s.io/kubernetes v1.36.3") or bin/.npapi-version.
func stampedVersion(bin, stamp string) string {
	b, err := os.ReadFile(filepath.Join(bin, stamp))
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return ""
	}
	return f[1]
}
