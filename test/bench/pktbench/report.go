package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// figures are one pair's numbers (pure arithmetic on the counters).
type figures struct {
	offeredPPS, arrivedPPS, forwardedPPS float64
	delivered                            float64 // forwarded / offered
	localShare                           float64 // of the forwarded, to local backends
	senderNs                             float64 // baseline: pipeline CPU per packet dropped at once
	pipelineNs                           float64 // forward run: pipeline CPU per offered packet
	nodeNs                               float64 // the node's CPU per forwarded packet
	proxyCores, otherCores               float64
	nodeNsMin, nodeNsMax                 float64 // over the pairs (medians only)
}

// figuresOf computes a pair's figures. The node's CPU per forwarded packet
// is the forward run's pipeline CPU less what the same number of packets
// cost in the baseline (sending them, and the node taking them in up to
// its uplink's ingress hook), over the packets forwarded.
func figuresOf(p pair, local []bool) (figures, bool) {
	f, b := p.fwd, p.base
	if f.gen.Sent == 0 || b.gen.Sent == 0 || f.gen.Elapsed <= 0 {
		return figures{}, false
	}
	var fx figures
	secs := f.gen.Elapsed.Seconds()
	fwd := float64(f.forwarded())
	fx.offeredPPS = float64(f.gen.Sent) / secs
	fx.arrivedPPS = float64(f.arrived) / secs
	fx.forwardedPPS = fwd / secs
	fx.delivered = fwd / float64(f.gen.Sent)
	var loc float64
	for i, n := range f.fwd {
		if i < len(local) && local[i] {
			loc += float64(n)
		}
	}
	if fwd > 0 {
		fx.localShare = loc / fwd
	}
	fx.senderNs = float64(b.pipeline().Nanoseconds()) / float64(b.gen.Sent)
	fx.pipelineNs = float64(f.pipeline().Nanoseconds()) / float64(f.gen.Sent)
	if fwd > 0 {
		fx.nodeNs = (float64(f.pipeline().Nanoseconds()) - fx.senderNs*float64(f.gen.Sent)) / fwd
	}
	fx.proxyCores = f.proxyCPU.Seconds() / secs
	fx.otherCores = (f.busy - f.pipeline() - f.proxyCPU).Seconds() / secs
	return fx, true
}

// medians is the median of each figure over the pairs.
func medians(fs []figures) figures {
	pick := func(get func(figures) float64) float64 {
		v := make([]float64, len(fs))
		for i, f := range fs {
			v[i] = get(f)
		}
		slices.Sort(v)
		if len(v) == 0 {
			return 0
		}
		if len(v)%2 == 0 {
			return (v[len(v)/2-1] + v[len(v)/2]) / 2
		}
		return v[len(v)/2]
	}
	return figures{
		offeredPPS:   pick(func(f figures) float64 { return f.offeredPPS }),
		arrivedPPS:   pick(func(f figures) float64 { return f.arrivedPPS }),
		forwardedPPS: pick(func(f figures) float64 { return f.forwardedPPS }),
		delivered:    pick(func(f figures) float64 { return f.delivered }),
		localShare:   pick(func(f figures) float64 { return f.localShare }),
		senderNs:     pick(func(f figures) float64 { return f.senderNs }),
		pipelineNs:   pick(func(f figures) float64 { return f.pipelineNs }),
		nodeNs:       pick(func(f figures) float64 { return f.nodeNs }),
		proxyCores:   pick(func(f figures) float64 { return f.proxyCores }),
		otherCores:   pick(func(f figures) float64 { return f.otherCores }),
	}
}

// summary is a subject's medians, ok false without a measurement.
func summary(r result) (figures, bool) {
	if r.err != nil || r.notRun != "" || len(r.pairs) == 0 {
		return figures{}, false
	}
	local := make([]bool, len(r.pods))
	for i, p := range r.pods {
		local[i] = p.local
	}
	var fs []figures
	for _, p := range r.pairs {
		if f, ok := figuresOf(p, local); ok {
			fs = append(fs, f)
		}
	}
	if len(fs) == 0 {
		return figures{}, false
	}
	m := medians(fs)
	m.nodeNsMin, m.nodeNsMax = fs[0].nodeNs, fs[0].nodeNs
	for _, f := range fs {
		m.nodeNsMin, m.nodeNsMax = min(m.nodeNsMin, f.nodeNs), max(m.nodeNsMax, f.nodeNs)
	}
	return m, true
}

// perCore is the node's forwarding rate per core: 1 s of one core over
// its CPU per forwarded packet.
func (f figures) perCore() float64 {
	if f.nodeNs <= 0 {
		return 0
	}
	return 1e9 / f.nodeNs
}

// ratioTo formats a/b, "-" when either is missing.
func ratioTo(a, b float64, ok bool) string {
	if !ok || a <= 0 || b <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", a/b)
}

const (
	refPeer  = "kp-nftables" // the upstream peer the ratios are against
	refSelf  = "weft-ebpf"   // weft's own tc path
	refRoute = "route"       // no proxy: the node routes to the pods themselves
)

// report prints the table: a row per figure, a column per subject.
func report(out io.Writer, results []result) {
	sums := map[string]figures{}
	has := map[string]bool{}
	for _, r := range results {
		sums[r.name], has[r.name] = summary(r)
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := []string{""}
	for _, r := range results {
		head = append(head, r.name)
	}
	fmt.Fprintln(tw, strings.Join(head, "\t")+"\t")
	row := func(label string, cell func(r result, f figures) string) {
		cells := []string{label}
		for _, r := range results {
			if !has[r.name] {
				cells = append(cells, "-")
				continue
			}
			cells = append(cells, cell(r, sums[r.name]))
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t")
	}
	mpps := func(v float64) string { return fmt.Sprintf("%.3f", v/1e6) }
	row("offered (Mpps)", func(_ result, f figures) string { return mpps(f.offeredPPS) })
	row("arrived at node (Mpps)", func(_ result, f figures) string { return mpps(f.arrivedPPS) })
	row("forwarded (Mpps)", func(_ result, f figures) string { return mpps(f.forwardedPPS) })
	row("forwarded / offered", func(_ result, f figures) string { return fmt.Sprintf("%.3f", f.delivered) })
	row("to local backends", func(_ result, f figures) string { return fmt.Sprintf("%.0f%%", 100*f.localShare) })
	row("baseline CPU / pkt (ns)", func(_ result, f figures) string { return fmt.Sprintf("%.0f", f.senderNs) })
	row("run CPU / offered pkt (ns)", func(_ result, f figures) string { return fmt.Sprintf("%.0f", f.pipelineNs) })
	row("node CPU / fwd pkt (ns)", func(_ result, f figures) string { return fmt.Sprintf("%.0f", f.nodeNs) })
	row("  the same, min-max", func(_ result, f figures) string { return fmt.Sprintf("%.0f-%.0f", f.nodeNsMin, f.nodeNsMax) })
	row("node Mpps per core", func(_ result, f figures) string { return fmt.Sprintf("%.3f", f.perCore()/1e6) })
	if rt, ok := sums[refRoute], has[refRoute]; ok {
		row("node CPU above "+refRoute+" (ns)", func(r result, f figures) string {
			if r.name == refRoute {
				return "-"
			}
			return fmt.Sprintf("%.0f", f.nodeNs-rt.nodeNs)
		})
		row("the same / "+refPeer+"'s", func(r result, f figures) string {
			peer, ok := sums[refPeer], has[refPeer]
			if r.name == refRoute || !ok || peer.nodeNs <= rt.nodeNs {
				return "-"
			}
			return fmt.Sprintf("%.2f", (f.nodeNs-rt.nodeNs)/(peer.nodeNs-rt.nodeNs))
		})
	}
	for _, ref := range []string{refPeer, refSelf} {
		rf, ok := sums[ref], has[ref]
		row("per core / "+ref, func(_ result, f figures) string { return ratioTo(f.perCore(), rf.perCore(), ok) })
		row("forwarded / "+ref, func(_ result, f figures) string { return ratioTo(f.forwardedPPS, rf.forwardedPPS, ok) })
	}
	row("proxy process (cores)", func(_ result, f figures) string { return fmt.Sprintf("%.3f", f.proxyCores) })
	row("other load (cores)", func(_ result, f figures) string { return fmt.Sprintf("%.2f", f.otherCores) })
	_ = tw.Flush()
	for _, r := range results {
		switch {
		case r.notRun != "":
			fmt.Fprintf(out, "   %s: not run: %s\n", r.name, r.notRun)
		case r.err != nil:
			fmt.Fprintf(out, "   %s: error: %v\n", r.name, r.err)
		}
	}
}

// describe prints what one subject's checks found and its runs.
func describe(out io.Writer, r result) {
	if r.answers != nil {
		fmt.Fprintf(out, "   probe answers per backend: %v\n", r.answers)
	}
	if r.check != "" {
		fmt.Fprintf(out, "   %s; backends' rx over an idle second: %d\n", r.check, r.idleRx)
	}
}

// describeRun prints pair i of r.
func describeRun(out io.Writer, r result, i int) {
	if r.err != nil {
		fmt.Fprintf(out, "   %s: error: %v\n", r.name, r.err)
	}
	if i < 0 || i >= len(r.pairs) {
		return
	}
	local := make([]bool, len(r.pods))
	for i, p := range r.pods {
		local[i] = p.local
	}
	p := r.pairs[i]
	f, ok := figuresOf(p, local)
	if !ok {
		return
	}
	fmt.Fprintf(out, "   %s: baseline %d pkts in %v (%.0f ns/pkt); forward %d sent, %d arrived, %d refused, %d forwarded %v, gen CPU %v + ksoftirqd %v in %v: node %.0f ns/pkt, other load %.2f cores\n",
		r.name, p.base.gen.Sent, p.base.gen.Elapsed.Round(time.Millisecond), f.senderNs,
		p.fwd.gen.Sent, p.fwd.arrived, p.fwd.refused, p.fwd.forwarded(), p.fwd.fwd,
		p.fwd.gen.CPU.Round(time.Millisecond), p.fwd.softirqd.Round(time.Millisecond), p.fwd.gen.Elapsed.Round(time.Millisecond), f.nodeNs, f.otherCores)
}
