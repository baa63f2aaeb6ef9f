package cni

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// TraceEnv, when set in the plugin's environment, makes ADD and DEL print
// where their time went to stderr, as one line starting with TracePrefix:
// "weft-cni-trace ADD init=1.2ms parse=0.1ms ... total=5.1ms pid=42" (pid
// is the process that served the command: the plugin's own, or the
// resident server's). test/bench/cnibench reads it for its breakdown, and
// the tests to tell which path served a command; nothing else should.
const (
	TraceEnv    = "WEFT_CNI_TRACE"
	TracePrefix = "weft-cni-trace"
)

// initTime is when the plugin's Go code started running (after the
// kernel's exec and the Go runtime's start): where a plugin process's
// command begins.
var initTime = time.Now()

// tracer times the phases of one command; nil (tracing off) ignores calls.
type tracer struct {
	cmd    string
	start  time.Time
	last   time.Time
	out    io.Writer
	phases []string
}

// newTracer starts the trace of the command args describe, if it asked
// for one. Its first phase, init, runs from the command's start: a
// process's first Go code, or the resident server's reading the request.
func newTracer(cmd string, args *CmdArgs) *tracer {
	if !args.trace {
		return nil
	}
	now := time.Now()
	t := &tracer{cmd: cmd, start: args.start, last: now, out: args.Stderr}
	t.phases = append(t.phases, fmt.Sprintf("init=%s", ms(now.Sub(args.start))))
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

// print writes the trace line; total counts from the command's start.
func (t *tracer) print() {
	if t == nil {
		return
	}
	fmt.Fprintf(t.out, "%s %s %s total=%s pid=%d\n", TracePrefix, t.cmd, strings.Join(t.phases, " "), ms(time.Since(t.start)), os.Getpid())
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3fms", float64(d)/float64(time.Millisecond)) }
