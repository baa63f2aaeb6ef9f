package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/weftnet/weft/policy"
	polipt "github.com/weftnet/weft/policy/iptables"
)

func run(nPol, nPods, conns, runs int) error {
	in := world(nPods)
	in.Policies = scalePolicies(nPol)
	fmt.Printf("policybench: %d policies, %d pods (all on this node), %d runs\n\n", nPol, nPods, runs)

	var compile, render []time.Duration
	var d policy.Desired
	var rs *polipt.Ruleset
	for range runs {
		t0 := time.Now()
		d = policy.Compile(in)
		compile = append(compile, time.Since(t0))
		t0 = time.Now()
		rs = polipt.Render(d, polipt.Config{NodeName: nodeName})
		render = append(render, time.Since(t0))
	}
	rules, members := 0, 0
	for _, c := range rs.Chains {
		rules += len(c.Rules)
	}
	for _, s := range rs.Sets {
		members += len(s.Members)
	}
	fmt.Printf("compiled: %d isolated pods, %d sets; rendered: %d chains, %d rules, %d ipsets with %d members\n",
		len(d.Pods), len(d.Sets), len(rs.Chains), rules, len(rs.Sets), members)

	var full, edit, relabel []time.Duration
	for i := range runs {
		a := &polipt.Applier{}
		if err := a.Cleanup(); err != nil {
			return err
		}
		t0 := time.Now()
		if _, err := a.Apply(rs); err != nil {
			return fmt.Errorf("full apply: %w", err)
		}
		full = append(full, time.Since(t0))
		// One policy edited (its port), then put back.
		p := in.Policies[i%len(in.Policies)]
		orig := p.DeepCopy()
		p.Spec.Ingress[0].Ports[0].Port.IntVal, p.Spec.Ingress[0].Ports[0].Port.Type = 8080, 0
		p.Spec.Ingress[0].Ports[0].Port.StrVal = ""
		d2 := policy.Compile(in)
		rs2 := polipt.Render(d2, polipt.Config{NodeName: nodeName})
		t0 = time.Now()
		if _, err := a.Apply(rs2); err != nil {
			return fmt.Errorf("apply after an edit: %w", err)
		}
		edit = append(edit, time.Since(t0))
		in.Policies[i%len(in.Policies)] = orig
		// One pod relabelled.
		pod := in.Pods[i]
		old := pod.Labels["role"]
		pod.Labels["role"] = "moved"
		rs3 := polipt.Render(policy.Compile(in), polipt.Config{NodeName: nodeName})
		t0 = time.Now()
		if _, err := a.Apply(rs3); err != nil {
			return fmt.Errorf("apply after a relabel: %w", err)
		}
		relabel = append(relabel, time.Since(t0))
		pod.Labels["role"] = old
	}
	fmt.Printf("\n%-52s %12s\n", "step (median)", "time")
	fmt.Printf("%-52s %12s\n", "compile", median(compile).Round(time.Microsecond))
	fmt.Printf("%-52s %12s\n", "render", median(render).Round(time.Microsecond))
	fmt.Printf("%-52s %12s\n", "apply, first (ipset restore + iptables-restore)", median(full).Round(time.Microsecond))
	fmt.Printf("%-52s %12s\n", "apply, one policy edited", median(edit).Round(time.Microsecond))
	fmt.Printf("%-52s %12s\n", "apply, one pod relabelled", median(relabel).Round(time.Microsecond))
	if err := (&polipt.Applier{}).Cleanup(); err != nil {
		return err
	}

	b, err := newConnBed()
	if err != nil {
		return err
	}
	defer b.close()
	type rateCase struct {
		name    string
		n       int // policies selecting the server; 0: none
		ports   bool
		rs      *polipt.Ruleset
		chain   int
		samples []float64
	}
	cases := []*rateCase{{name: "no policy"}, {name: "1 policy", n: 1}, {name: fmt.Sprintf("%d policies", nPol), n: nPol},
		{name: fmt.Sprintf("%d policies, each its own port (worst case)", nPol), n: nPol, ports: true}}
	for _, c := range cases {
		w := world(nPods)
		if c.n > 0 {
			w.Policies = serverPolicies(c.n, c.ports)
		}
		c.rs = polipt.Render(policy.Compile(w), polipt.Config{NodeName: nodeName})
		for _, ch := range c.rs.Chains {
			if strings.HasPrefix(ch.Name, "WEFT-POL-I-") {
				c.chain = len(ch.Rules)
			}
		}
	}
	// Interleaved (none, 1, N, none, 1, N, ...) so that load from other
	// processes on the machine hits every case alike.
	a := &polipt.Applier{}
	for range runs {
		for _, c := range cases {
			if _, err := a.Apply(c.rs); err != nil {
				return err
			}
			r, err := b.rate(conns)
			if err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			c.samples = append(c.samples, r)
		}
	}
	if err := a.Cleanup(); err != nil {
		return err
	}
	fmt.Printf("\n%-52s %12s %8s\n", "TCP connections/s through the server pod", "median", "chain")
	for _, c := range cases {
		fmt.Printf("%-52s %12.0f %8d\n", c.name, medianF(c.samples), c.chain)
	}
	none, one, many, worst := medianF(cases[0].samples), medianF(cases[1].samples), medianF(cases[2].samples), medianF(cases[3].samples)
	fmt.Printf("\nratio %d policies : 1 policy = %.2f (1.00 is flat); 1 policy : none = %.2f; worst case : 1 policy = %.2f\n",
		nPol, many/one, one/none, worst/one)
	return nil
}
