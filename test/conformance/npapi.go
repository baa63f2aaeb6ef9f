package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/lab"
)

// The network-policy-api conformance suite (-suite network-policy-api):
// bin/npapi-conformance.test, built by hack/build-npapi.sh from
// hack/npapi, run through `go tool test2json` so that each test's verdict
// and output come as events.
const (
	suiteE2E   = "e2e"
	suiteNPAPI = "network-policy-api"
	npapiTest  = "npapi-conformance.test"
)

// npapiModes are the default modes of the policy suite: one per policy
// backend (ebpf mode enforces NetworkPolicy with the iptables one).
var npapiModes = []string{"iptables", "nftables"}

// testEvent is one line of test2json's output.
type testEvent struct {
	Action string
	Test   string
	Output string
}

// npapiCase is one test or subtest of a run.
type npapiCase struct {
	action string // pass, fail or skip; empty: never ended
	output []string
	parent bool // some other test is its subtest
}

// ParseTestEvents counts the tests of a test2json stream into a Result
// (Mode, Err and Duration are left to the caller). A spec is a test with
// no subtest (the suite's checks are subtests of its tests, which are
// subtests of TestConformance); a test with subtests counts only when it
// failed while none of its subtests did (a setup failure). A failed spec
// whose failures were all SCTP probes' (stoppedBySCTP), on nodes without
// SCTP, is counted in SCTPStopped rather than Failed: the probe ended the
// spec before the checks after it ran, so the spec proved nothing either
// way.
func ParseTestEvents(r io.Reader, noSCTP bool) (Result, error) {
	var res Result
	cases := map[string]*npapiCase{}
	var order []string
	get := func(name string) *npapiCase {
		c := cases[name]
		if c == nil {
			c = &npapiCase{}
			cases[name] = c
			order = append(order, name)
		}
		return c
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e testEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			// test2json passes on what is not the test's output (a
			// crash of the binary) as is.
			continue
		}
		if e.Test == "" {
			continue
		}
		c := get(e.Test)
		switch e.Action {
		case "output":
			c.output = append(c.output, e.Output)
		case "pass", "fail", "skip":
			c.action = e.Action
		}
	}
	if err := sc.Err(); err != nil {
		return res, fmt.Errorf("reading the test events: %w", err)
	}
	if len(cases) == 0 {
		return res, errors.New("no test ran")
	}
	for name := range cases {
		for p := parentName(name); p != ""; p = parentName(p) {
			get(p).parent = true
		}
	}
	failedBelow := map[string]bool{}
	for _, name := range order {
		if cases[name].action == "fail" {
			for p := parentName(name); p != ""; p = parentName(p) {
				failedBelow[p] = true
			}
		}
	}
	for _, name := range order {
		c := cases[name]
		if c.parent && (c.action != "fail" || failedBelow[name]) {
			continue
		}
		if c.action == "fail" && noSCTP && stoppedBySCTP(c.output) {
			res.SCTPStopped = append(res.SCTPStopped, name)
			continue
		}
		res.Run++
		switch c.action {
		case "pass":
			res.Passed++
		case "skip":
			res.Skipped++
		case "fail":
			res.Failed++
			res.FailedSpecs = append(res.FailedSpecs, name)
		default:
			res.Failed++
			res.FailedSpecs = append(res.FailedSpecs, name+" (did not end)")
		}
	}
	return res, nil
}

func parentName(name string) string {
	i := strings.LastIndexByte(name, '/')
	if i < 0 {
		return ""
	}
	return name[:i]
}

// stoppedBySCTP reports whether every failure in a test's output is an
// SCTP probe's. The suite's probes retry until they see what they expect
// (a failed attempt logs "FAILED Command was [/agnhost connect ...
// --protocol=P ...]", or "FAILED to execute command [...]", and is
// harmless if a later attempt succeeds). A failure is a testify error
// ("\tError: <message>"); a probe's is "Condition never satisfied" (no
// attempt succeeded in time) or "Should be true" (the check after one
// did), and belongs to the last failed attempt logged before it. Any other
// failure (an API call, a setup step) is not an SCTP probe's.
func stoppedBySCTP(output []string) bool {
	failures := 0
	lastProbe := ""
	for _, line := range output {
		switch {
		case strings.Contains(line, "FAILED Command was"), strings.Contains(line, "FAILED to execute command"):
			lastProbe = line
		case strings.Contains(line, "\tError:"):
			probeFailure := strings.Contains(line, "Condition never satisfied") || strings.Contains(line, "Should be true")
			if !probeFailure || !strings.Contains(lastProbe, "--protocol=sctp") {
				return false
			}
			failures++
			lastProbe = ""
		}
	}
	return failures > 0
}

// sctpAvailable reports whether this kernel (the lab nodes') has SCTP.
func sctpAvailable() bool {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP)
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
}

// runNPAPI runs the policy suite from the lab's external host: test2json's
// events to <out>/npapi.json, the tests' output to <out>/npapi.log and a
// line per finished test to stdout.
func runNPAPI(ctx context.Context, c config, mode, kubeconfig, out string) Result {
	events := filepath.Join(out, "npapi.json")
	runErr := runTest2JSON(ctx, c, mode, kubeconfig, out, events)
	f, err := os.Open(events)
	if err != nil {
		return Result{Err: err}
	}
	defer f.Close()
	res, err := ParseTestEvents(f, c.noSCTP)
	switch {
	case err != nil && runErr != nil:
		res.Err = fmt.Errorf("%s: %v, and %v", npapiTest, runErr, err)
	case err != nil:
		res.Err = err
	case runErr != nil && len(res.FailedSpecs) == 0 && len(res.SCTPStopped) == 0:
		res.Err = fmt.Errorf("%s: %v (see %s)", npapiTest, runErr, filepath.Join(out, "npapi.log"))
	case res.Run == 0:
		res.Err = errors.New("-focus and -skip selected no test")
	}
	return res
}

func runTest2JSON(ctx context.Context, c config, mode, kubeconfig, out, events string) error {
	ev, err := os.Create(events)
	if err != nil {
		return err
	}
	defer ev.Close()
	log, err := os.Create(filepath.Join(out, "npapi.log"))
	if err != nil {
		return err
	}
	defer log.Close()
	goTool, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("go (for go tool test2json): %w", err)
	}
	args := []string{"tool", "test2json", "-t", filepath.Join(c.bin, npapiTest),
		"-test.v=test2json", "-test.timeout=" + c.timeout.String()}
	if c.focus != "" {
		args = append(args, "-test.run="+c.focus)
	}
	if c.skip != "" {
		args = append(args, "-test.skip="+c.skip)
	}
	if c.noSCTP {
		args = append(args, "-no-sctp")
	}
	runCtx, cancel := context.WithTimeout(ctx, c.timeout+10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(runCtx, goTool, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = io.MultiWriter(ev, pw), log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = time.Minute
	fmt.Fprintf(log, "# %s\n", strings.Join(cmd.Args, " "))
	done := make(chan struct{})
	go func() {
		defer close(done)
		reportTests(pr, log, mode)
	}()
	if err := netnsutil.Do(netnsutil.RunDir+"/"+lab.ExternalNS, cmd.Start); err != nil {
		pw.Close()
		<-done
		return err
	}
	err = cmd.Wait()
	pw.Close()
	<-done
	return err
}

// reportTests writes each test's output to log and a line per finished
// test to stdout.
func reportTests(r io.Reader, log io.Writer, mode string) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e testEvent
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			fmt.Fprintln(log, sc.Text())
			continue
		}
		switch e.Action {
		case "output":
			io.WriteString(log, e.Output)
		case "pass", "fail", "skip":
			if e.Test != "" {
				fmt.Printf("[%s] %s %s\n", mode, strings.ToUpper(e.Action), e.Test)
			}
		}
	}
	io.Copy(io.Discard, r)
}

// npapiPreflight checks the policy suite's binary and chooses -no-sctp.
func npapiPreflight(c *config) error {
	if _, err := os.Stat(filepath.Join(c.bin, npapiTest)); err != nil {
		return fmt.Errorf("%s missing: `make conformance-policy` builds it", filepath.Join(c.bin, npapiTest))
	}
	c.noSCTP = !sctpAvailable()
	return nil
}
