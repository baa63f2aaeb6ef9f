package main

import (
	"bytes"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// progress reads ginkgo's verbose output (-v --no-color) and writes one
// short line per finished spec. For each finished spec ginkgo prints a
// header ("• [12.3 seconds]", "• [FAILED] [4.5 seconds]", "S [SKIPPED]
// [0.1 seconds]", "[SynchronizedBeforeSuite] [FAILED] ..."): in parallel
// runs the spec's text follows it; in serial runs (-procs 1) a passed
// spec's text came before, after a delimiter line, when the spec started.
type progress struct {
	mode  string
	out   io.Writer
	now   func() time.Time
	begin time.Time
	line  []byte // an incomplete line

	total, done, failed int
	state               string // the header's state, awaiting the spec's text
	afterDelimiter      bool   // the previous line was a delimiter
	started             string // the text of the spec that started last (serial runs)
}

var (
	willRunRE = regexp.MustCompile(`^Will run (\d+) of (\d+) specs`)
	// A spec's header: denoter, state unless passed, run time. A bare
	// "S" is a run of specs the focus or skip left out (one each).
	specHeaderRE = regexp.MustCompile(`^(•|S)(?: \[([A-Z][A-Z ]*[A-Z])\])? \[[0-9.]+ seconds\]$`)
	// A suite node's header; only failures are shown.
	suiteHeaderRE = regexp.MustCompile(`^\[([A-Za-z]+)\] \[([A-Z][A-Z ]*[A-Z])\]`)
	delimiterRE   = regexp.MustCompile(`^-{30}$`)
	skipsRE       = regexp.MustCompile(`^S+$`) // specs the focus or skip left out
)

func newProgress(mode string, out io.Writer) *progress {
	return &progress{mode: mode, out: out, now: time.Now, begin: time.Now()}
}

func (p *progress) Write(b []byte) (int, error) {
	n := len(b)
	for {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			p.line = append(p.line, b...)
			return n, nil
		}
		p.line = append(p.line, b[:i]...)
		p.handle(strings.TrimRight(string(p.line), "\r "))
		p.line, b = p.line[:0], b[i+1:]
	}
}

func (p *progress) handle(line string) {
	afterDelimiter := p.afterDelimiter
	p.afterDelimiter = delimiterRE.MatchString(line)
	if p.state != "" {
		state, text := p.state, line
		p.state = ""
		if p.afterDelimiter || line == "" || skipsRE.MatchString(line) {
			text = p.started
		}
		p.done++
		if state != "passed" && state != "skipped" {
			p.failed++
		}
		p.printf("%-7s %s", state, text)
		return
	}
	if m := willRunRE.FindStringSubmatch(line); m != nil {
		p.total, _ = strconv.Atoi(m[1])
		p.printf("ginkgo will run %s of %s specs", m[1], m[2])
		return
	}
	if m := specHeaderRE.FindStringSubmatch(line); m != nil {
		switch {
		case m[2] != "":
			p.state = strings.ToLower(m[2])
		case m[1] == "•":
			p.state = "passed"
		default:
			p.state = "skipped"
		}
		return
	}
	if m := suiteHeaderRE.FindStringSubmatch(line); m != nil {
		p.failed++
		p.printf("%s %s", strings.ToLower(m[2]), m[1])
		return
	}
	if afterDelimiter && line != "" && !p.afterDelimiter && !skipsRE.MatchString(line) {
		p.started = line
	}
}

// printf writes "[mode done/total elapsed, N failed] message", the
// message cut to keep the line short.
func (p *progress) printf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if r := []rune(msg); len(r) > 110 {
		msg = string(r[:109]) + "…"
	}
	failed := ""
	if p.failed > 0 {
		failed = fmt.Sprintf(", %d failed", p.failed)
	}
	elapsed := p.now().Sub(p.begin).Round(time.Second)
	fmt.Fprintf(p.out, "[%s %d/%d %s%s] %s\n", p.mode, p.done, p.total, elapsed, failed, msg)
}
