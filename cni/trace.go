package cni

import (
	"fmt"
	"os"
	"strings"
	"time"
)

// TraceEnv, when set in the plugin's environment, makes ADD and DEL print
// where their time went to stderr, as one line starting with TracePrefix:
// "weft-cni-trace ADD init=1.2ms parse=0.1ms ...". test/bench/cnibench
// reads it for its breakdown; nothing else should.
const (
	TraceEnv    = "WEFT_CNI_TRACE"
	TracePrefix = "weft-cni-trace"
)

// initTime is when the plugin's Go code started running (after the
// kernel's exec and the Go runtime's start).
var initTime = time.Now()

// tracer times the phases of one command; nil (tracing off) ignores calls.
type tracer struct {
	cmd    string
	last   time.Time
	phases []string
}

func newTracer(cmd string) *tracer {
	if os.Getenv(TraceEnv) == "" {
		return nil
	}
	now := time.Now()
	t := &tracer{cmd: cmd, last: now}
	t.phases = append(t.phases, fmt.Sprintf("init=%s", ms(now.Sub(initTime))))
	return t
}

// mark ends the phase called name.
func (t *tracer) mark(name string) {
	if t == nil {
		return
	}
	now := time.Now()
	t.phases = append(t.phases, fmt.Sprintf("%s=%s", name, ms(now.Sub(t.last))))
	t.last = now
}

// print writes the trace line; total counts from initTime.
func (t *tracer) print() {
	if t == nil {
		return
	}
	fmt.Fprintf(os.Stderr, "%s %s %s total=%s\n", TracePrefix, t.cmd, strings.Join(t.phases, " "), ms(time.Since(initTime)))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3fms", float64(d)/float64(time.Millisecond)) }
