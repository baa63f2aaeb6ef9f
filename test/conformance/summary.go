package main

import (
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// Result is one mode's outcome: the counts of its JUnit report, or why
// there is none.
type Result struct {
	Mode string
	// Run is the number of specs the focus and skip selected: Passed +
	// Failed + Skipped.
	Run, Passed, Failed int
	// Skipped counts the selected specs the suite skipped itself at run
	// time (e2eskipper: a missing provider feature, too few nodes, ...).
	Skipped int
	// ConformanceRun and ConformancePassed count the selected
	// [Conformance] specs that ran and passed.
	ConformanceRun, ConformancePassed int
	// FailedSpecs names the failed specs and failed suite nodes
	// ("[SynchronizedBeforeSuite]"), a state other than "failed" in
	// parentheses ("(timedout)").
	FailedSpecs []string
	// SCTPStopped names the policy suite's tests, on nodes without SCTP,
	// that an SCTP probe ended (ParseTestEvents): neither passed nor
	// failed, and not counted in Run.
	SCTPStopped []string
	// Err is a failure outside the specs: the lab did not come up, ginkgo
	// failed without a report, no spec was selected.
	Err      error
	Duration time.Duration
}

// OK reports whether the mode passed: no failed spec or suite node and no
// failure outside the specs.
func (r Result) OK() bool { return r.Err == nil && len(r.FailedSpecs) == 0 }

// junitCase is a <testcase> of the report e2e.test writes with
// --report-dir (ginkgo's JUnit reporter: the name is "[<node type>]
// <full spec text>", the status one of ginkgo's spec states).
type junitCase struct {
	Name    string `xml:"name,attr"`
	Status  string `xml:"status,attr"`
	Skipped *struct {
		Message string `xml:"message,attr"`
	} `xml:"skipped"`
}

// ParseJUnit counts the specs of a ginkgo JUnit report into a Result
// (Mode, Err and Duration are left to the caller). Ginkgo reports every
// spec of the suite: those the focus or skip left out are "skipped" with
// the bare message "skipped" and are not counted; a spec the suite
// skipped itself has "skipped - <reason>".
func ParseJUnit(r io.Reader) (Result, error) {
	var res Result
	d := xml.NewDecoder(r)
	cases := 0
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return res, fmt.Errorf("reading the JUnit report: %w", err)
		}
		se, ok := tok.(xml.StartElement)
		if !ok || se.Name.Local != "testcase" {
			continue
		}
		var c junitCase
		if err := d.DecodeElement(&c, &se); err != nil {
			return res, fmt.Errorf("reading the JUnit report: %w", err)
		}
		cases++
		res.add(c)
	}
	if cases == 0 {
		return res, errors.New("the JUnit report has no testcase")
	}
	return res, nil
}

// add counts one testcase.
func (r *Result) add(c junitCase) {
	name, isSpec := strings.CutPrefix(c.Name, "[It] ")
	failed := false
	switch c.Status {
	case "passed":
		if !isSpec {
			return
		}
		r.Run++
		r.Passed++
	case "skipped":
		// Not selected, or skipped because an earlier failure or an
		// interrupt stopped the run (which that failure reports).
		if !isSpec || c.Skipped == nil || !strings.HasPrefix(c.Skipped.Message, "skipped - ") {
			return
		}
		r.Run++
		r.Skipped++
		return
	case "pending", "":
		return
	default: // failed, timedout, interrupted, aborted, panicked
		failed = true
		if c.Status != "failed" {
			name += " (" + c.Status + ")"
		}
		r.FailedSpecs = append(r.FailedSpecs, name)
		if !isSpec {
			return
		}
		r.Run++
		r.Failed++
	}
	if strings.Contains(name, "[Conformance]") {
		r.ConformanceRun++
		if !failed {
			r.ConformancePassed++
		}
	}
}

// Selection describes what the run selected, for the summary's header.
type Selection struct {
	Suite        string // suiteE2E or suiteNPAPI
	Focus, Skip  string
	Nodes, Procs int
	Version      string // the suite's, e.g. "v1.36.3"; empty: not shown
	ResultsDir   string // where each mode's logs and reports are
	NoSCTP       bool   // the policy suite ran with -no-sctp
}

// Summary renders the results as Markdown: the selection, one table row
// per mode, the failed specs of each mode, and the verdict as the last
// line.
func Summary(sel Selection, results []Result) string {
	var b strings.Builder
	npapi := sel.Suite == suiteNPAPI
	if npapi {
		b.WriteString("# network-policy-api conformance on the weft lab\n\n")
		if sel.Version != "" {
			fmt.Fprintf(&b, "sigs.k8s.io/network-policy-api %s, ", sel.Version)
		}
		fmt.Fprintf(&b, "%d upstream kubelet nodes.\n\n", sel.Nodes)
		fmt.Fprintf(&b, "- run: `%s`\n- skip: `%s`\n", sel.Focus, sel.Skip)
		if sel.NoSCTP {
			b.WriteString("- -no-sctp: the nodes' kernel has no SCTP; the base pods have no SCTP servers, the SCTP-only tests are skipped, and a test an SCTP probe stops is listed apart\n")
		}
	} else {
		b.WriteString("# Kubernetes e2e conformance on the weft lab\n\n")
		if sel.Version != "" {
			fmt.Fprintf(&b, "e2e.test %s, ", sel.Version)
		}
		fmt.Fprintf(&b, "%d upstream kubelet nodes, %d ginkgo processes.\n\n", sel.Nodes, sel.Procs)
		fmt.Fprintf(&b, "- focus: `%s`\n- skip: `%s`\n", sel.Focus, sel.Skip)
	}
	if sel.ResultsDir != "" {
		fmt.Fprintf(&b, "- logs and reports: `%s/<mode>/`\n", sel.ResultsDir)
	}
	last, lastHead := "[Conformance] passed", func(r Result) string { return fmt.Sprintf("%d/%d", r.ConformancePassed, r.ConformanceRun) }
	if npapi {
		last, lastHead = "stopped by an SCTP probe", func(r Result) string { return fmt.Sprint(len(r.SCTPStopped)) }
	}
	fmt.Fprintf(&b, "\n| mode | run | passed | failed | skipped | %s | time |\n", last)
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range results {
		if r.Err != nil && r.Run == 0 {
			fmt.Fprintf(&b, "| %s | - | - | - | - | - | %s |\n", r.Mode, duration(r.Duration))
			continue
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %s | %s |\n", r.Mode, r.Run, r.Passed, r.Failed, r.Skipped,
			lastHead(r), duration(r.Duration))
	}
	for _, r := range results {
		if len(r.SCTPStopped) > 0 {
			fmt.Fprintf(&b, "\n%s: stopped by an SCTP probe (%d):\n\n", r.Mode, len(r.SCTPStopped))
			for _, s := range r.SCTPStopped {
				fmt.Fprintf(&b, "- %s\n", s)
			}
		}
	}
	for _, r := range results {
		if r.OK() {
			continue
		}
		fmt.Fprintf(&b, "\n## %s\n", r.Mode)
		if r.Err != nil {
			fmt.Fprintf(&b, "\nError: %v\n", r.Err)
		}
		if len(r.FailedSpecs) > 0 {
			fmt.Fprintf(&b, "\nFailed (%d):\n\n", len(r.FailedSpecs))
			for _, s := range r.FailedSpecs {
				fmt.Fprintf(&b, "- %s\n", s)
			}
		}
	}
	verdict, _ := Verdict(results)
	fmt.Fprintf(&b, "\n%s\n", verdict)
	return b.String()
}

// Verdict is the one line CI reads last: PASS with the counts, or FAIL
// naming each failed mode and why.
func Verdict(results []Result) (line string, ok bool) {
	if len(results) == 0 {
		return "FAIL: no mode ran", false
	}
	var fails []string
	passed, stopped := 0, 0
	for _, r := range results {
		passed += r.Passed
		stopped += len(r.SCTPStopped)
		if r.OK() {
			continue
		}
		var why []string
		if n := len(r.FailedSpecs); n == 1 {
			why = append(why, "failed: "+r.FailedSpecs[0])
		} else if n > 1 {
			why = append(why, fmt.Sprintf("%d failed, first: %s", n, r.FailedSpecs[0]))
		}
		if r.Err != nil {
			why = append(why, r.Err.Error())
		}
		fails = append(fails, r.Mode+": "+strings.Join(why, "; "))
	}
	if len(fails) > 0 {
		return "FAIL: " + strings.Join(fails, " | "), false
	}
	modes := make([]string, len(results))
	for i, r := range results {
		modes[i] = r.Mode
	}
	line = fmt.Sprintf("PASS: %d specs passed in %d modes (%s)", passed, len(results), strings.Join(modes, ", "))
	if stopped > 0 {
		line += fmt.Sprintf("; %d stopped by an SCTP probe (no SCTP on the nodes)", stopped)
	}
	return line, true
}

func duration(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return d.Round(time.Second).String()
}
