package main

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

func sample(t *testing.T) Result {
	t.Helper()
	f, err := os.Open("testdata/junit_01.xml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := ParseJUnit(f)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestParseJUnit(t *testing.T) {
	got := sample(t)
	want := Result{
		// Not counted: the suite nodes, the two specs the focus or
		// skip left out ("skipped" without a reason).
		Run: 5, Passed: 2, Failed: 2, Skipped: 1,
		ConformanceRun: 2, ConformancePassed: 1,
		FailedSpecs: []string{
			"[sig-network] Services should serve a basic endpoint from pods  [Conformance]",
			"[sig-network] Netpol NetworkPolicy between server and client should enforce policy to allow traffic only from a different namespace, based on NamespaceSelector [Feature:NetworkPolicy] (timedout)",
			"[SynchronizedAfterSuite]",
		},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseJUnit:\n got %+v\nwant %+v", got, want)
	}
	if got.OK() {
		t.Error("OK() with failed specs")
	}
}

func TestParseJUnitErrors(t *testing.T) {
	for _, doc := range []string{
		"",
		"<testsuites><testsuite></testsuite></testsuites>",
		"<testsuites><testsuite><testcase name=",
	} {
		if _, err := ParseJUnit(strings.NewReader(doc)); err == nil {
			t.Errorf("ParseJUnit(%q): no error", doc)
		}
	}
}

func TestSummary(t *testing.T) {
	failed := sample(t)
	failed.Mode, failed.Duration = "iptables", 61*time.Minute+2*time.Second
	passed := Result{Mode: "nftables", Run: 3, Passed: 3, ConformanceRun: 1, ConformancePassed: 1, Duration: time.Minute}
	noLab := Result{Mode: "ebpf", Err: errors.New("lab up: kubelet did not register node2")}
	sel := Selection{Focus: `\[sig-network\]`, Skip: `SCTP`, Nodes: 3, Procs: 2, Version: "v1.36.3", ResultsDir: "/r"}

	got := Summary(sel, []Result{failed, passed, noLab})
	for _, want := range []string{
		"e2e.test v1.36.3, 3 upstream kubelet nodes, 2 ginkgo processes.",
		"- focus: `\\[sig-network\\]`\n- skip: `SCTP`\n",
		"| iptables | 5 | 2 | 2 | 1 | 1/2 | 1h1m2s |\n",
		"| nftables | 3 | 3 | 0 | 0 | 1/1 | 1m0s |\n",
		"| ebpf | - | - | - | - | - | - |\n",
		"## iptables\n\nFailed (3):\n\n- [sig-network] Services should serve a basic endpoint from pods  [Conformance]\n",
		"## ebpf\n\nError: lab up: kubelet did not register node2\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "## nftables") {
		t.Errorf("summary has a section for a passed mode:\n%s", got)
	}
	lines := strings.Split(strings.TrimSpace(got), "\n")
	last := lines[len(lines)-1]
	wantLast := "FAIL: iptables: 3 failed, first: [sig-network] Services should serve a basic endpoint from pods  [Conformance] | ebpf: lab up: kubelet did not register node2"
	if last != wantLast {
		t.Errorf("last line\n got %q\nwant %q", last, wantLast)
	}
}

func TestVerdict(t *testing.T) {
	ok := []Result{{Mode: "iptables", Run: 2, Passed: 2}, {Mode: "ebpf", Run: 3, Passed: 2, Skipped: 1}}
	if line, pass := Verdict(ok); !pass || line != "PASS: 4 specs passed in 2 modes (iptables, ebpf)" {
		t.Errorf("Verdict = %q, %v", line, pass)
	}
	one := []Result{{Mode: "nftables", Run: 1, Failed: 1, FailedSpecs: []string{"[sig-network] X"}}}
	if line, pass := Verdict(one); pass || line != "FAIL: nftables: failed: [sig-network] X" {
		t.Errorf("Verdict = %q, %v", line, pass)
	}
	if _, pass := Verdict(nil); pass {
		t.Error("Verdict(nil) passes")
	}
}

func TestParseTestEvents(t *testing.T) {
	f, err := os.Open("testdata/npapi.json")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got, err := ParseTestEvents(f, true)
	if err != nil {
		t.Fatal(err)
	}
	want := Result{
		// Not counted: TestConformance and CNPAdminTierGress (their
		// subtests failed), CNPBaselineTierIngressTCP (its subtest is
		// counted), the SCTP-stopped subtest.
		Run: 5, Passed: 1, Failed: 3, Skipped: 1,
		FailedSpecs: []string{
			// A TCP probe's recheck failed before the SCTP probe.
			"TestConformance/CNPAdminTierGress/deny",
			// A test without subtests, failed by an API call after
			// an SCTP probe's failed attempt.
			"TestConformance/CNPAdminTierPriorityField",
			"TestConformance/CNPBaselineTierIngressTCP/deny (did not end)",
		},
		// A TCP probe's failed attempt, then the SCTP probe's failure.
		SCTPStopped: []string{"TestConformance/CNPAdminTierGress/allow"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseTestEvents:\n got %+v\nwant %+v", got, want)
	}

	// With SCTP on the nodes an SCTP probe's failure is a failure.
	if _, err := f.Seek(0, 0); err != nil {
		t.Fatal(err)
	}
	got, err = ParseTestEvents(f, false)
	if err != nil {
		t.Fatal(err)
	}
	if got.Run != 6 || got.Failed != 4 || len(got.SCTPStopped) != 0 {
		t.Errorf("without -no-sctp: %+v", got)
	}

	if _, err := ParseTestEvents(strings.NewReader("FAIL\n"), true); err == nil {
		t.Error("a stream without tests parsed")
	}
}
