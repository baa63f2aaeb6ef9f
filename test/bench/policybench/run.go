package main

import (
	"fmt"
	"time"

	"github.com/weftnet/weft/policy"
)

func run(nPol, nCluster, nPods, conns, runs int, names string) error {
	bs, err := backends(names)
	if err != nil {
		return err
	}
	in := world(nPods)
	in.Policies = scalePolicies(nPol)
	in.ClusterPolicies = scaleClusterPolicies(nCluster)
	fmt.Printf("policybench: %d NetworkPolicies, %d ClusterNetworkPolicies, %d pods (all on this node), %d runs, backends %s\n\n",
		nPol, nCluster, nPods, runs, names)

	var compile []time.Duration
	var d policy.Desired
	for range runs {
		t0 := time.Now()
		d = policy.Compile(in)
		compile = append(compile, time.Since(t0))
	}
	fmt.Printf("compiled: %d isolated pods, %d sets\n", len(d.Pods), len(d.Sets))
	fmt.Printf("%-52s %12s\n", "compile (median)", median(compile).Round(time.Microsecond))
	for _, b := range bs {
		if err := scale(b, in, runs); err != nil {
			return fmt.Errorf("%s: %w", b.name(), err)
		}
	}
	return rates(bs, nPol, nCluster, nPods, conns, runs)
}

// scale measures render and apply of the scale world for one backend: the
// first apply into an empty kernel, then an apply after one policy edit
// and after one pod relabel (medians).
func scale(b backend, in policy.Input, runs int) error {
	var render, full, edit, relabel []time.Duration
	var r rendered
	d := policy.Compile(in)
	for range runs {
		t0 := time.Now()
		r = b.render(d)
		render = append(render, time.Since(t0))
	}
	fmt.Printf("\n%s: rendered %s\n", b.name(), r.describe())
	for i := range runs {
		if err := b.cleanup(); err != nil {
			return err
		}
		t0 := time.Now()
		if err := b.apply(r); err != nil {
			return fmt.Errorf("full apply: %w", err)
		}
		full = append(full, time.Since(t0))
		// One policy edited (its port), then put back.
		p := in.Policies[i%len(in.Policies)]
		orig := p.DeepCopy()
		p.Spec.Ingress[0].Ports[0].Port.IntVal, p.Spec.Ingress[0].Ports[0].Port.Type = 8080, 0
		p.Spec.Ingress[0].Ports[0].Port.StrVal = ""
		r2 := b.render(policy.Compile(in))
		t0 = time.Now()
		if err := b.apply(r2); err != nil {
			return fmt.Errorf("apply after an edit: %w", err)
		}
		edit = append(edit, time.Since(t0))
		in.Policies[i%len(in.Policies)] = orig
		// One pod relabelled.
		pod := in.Pods[i]
		old := pod.Labels["role"]
		pod.Labels["role"] = "moved"
		r3 := b.render(policy.Compile(in))
		t0 = time.Now()
		if err := b.apply(r3); err != nil {
			return fmt.Errorf("apply after a relabel: %w", err)
		}
		relabel = append(relabel, time.Since(t0))
		pod.Labels["role"] = old
	}
	fmt.Printf("%-52s %12s\n", b.name()+": step (median)", "time")
	fmt.Printf("%-52s %12s\n", "render", median(render).Round(time.Microsecond))
	fmt.Printf("%-52s %12s\n", "apply, first ("+b.applyWhat()+")", median(full).Round(time.Microsecond))
	fmt.Printf("%-52s %12s\n", "apply, one policy edited", median(edit).Round(time.Microsecond))
	fmt.Printf("%-52s %12s\n", "apply, one pod relabelled", median(relabel).Round(time.Microsecond))
	return b.cleanup()
}

// rates measures the connection rate through an isolated pod (sequential
// TCP connections, each a NEW conntrack entry walking the policy rules)
// with no policy, 1 policy, nPol policies and the worst case, for every
// backend, interleaved so that load from other processes on the machine
// hits every case alike.
func rates(bs []backend, nPol, nCluster, nPods, conns, runs int) error {
	b, err := newConnBed()
	if err != nil {
		return err
	}
	defer b.close()
	type rateCase struct {
		name    string
		be      backend
		n       int // policies selecting the server; 0: none
		ports   bool
		cluster int // ClusterNetworkPolicies selecting the server
		r       rendered
		samples []float64
	}
	var cases []*rateCase
	for _, be := range bs {
		for _, c := range []*rateCase{{name: "no policy"}, {name: "1 policy", n: 1}, {name: fmt.Sprintf("%d policies", nPol), n: nPol},
			{name: fmt.Sprintf("%d policies, each its own port (worst case)", nPol), n: nPol, ports: true},
			{name: "1 policy, 1 Admin ClusterNetworkPolicy", n: 1, cluster: 1},
			{name: fmt.Sprintf("%d policies, %d Admin ClusterNetworkPolicies", nPol, nCluster), n: nPol, cluster: nCluster}} {
			c.be = be
			w := world(nPods)
			if c.n > 0 {
				w.Policies = serverPolicies(c.n, c.ports)
			}
			w.ClusterPolicies = serverClusterPolicies(c.cluster)
			c.r = be.render(policy.Compile(w))
			cases = append(cases, c)
		}
	}
	for range runs {
		for _, c := range cases {
			if err := c.be.apply(c.r); err != nil {
				return err
			}
			r, err := b.rate(conns)
			if err != nil {
				return fmt.Errorf("%s %s: %w", c.be.name(), c.name, err)
			}
			c.samples = append(c.samples, r)
			if err := c.be.cleanup(); err != nil { // the next case may be the other backend's
				return err
			}
		}
	}
	fmt.Printf("\n%-62s %10s %6s\n", "TCP connections/s through the server pod", "median", "chain")
	for _, c := range cases {
		fmt.Printf("%-62s %10.0f %6d\n", c.be.name()+": "+c.name, medianF(c.samples), c.r.path())
	}
	for i, be := range bs {
		cs := cases[6*i : 6*i+6]
		none, one, many, worst := medianF(cs[0].samples), medianF(cs[1].samples), medianF(cs[2].samples), medianF(cs[3].samples)
		oneCluster, manyCluster := medianF(cs[4].samples), medianF(cs[5].samples)
		fmt.Printf("%s: ratio %d policies : 1 policy = %.2f (1.00 is flat); 1 policy : none = %.2f; worst case : 1 policy = %.2f; "+
			"%d ClusterNetworkPolicies beside %d policies : 1 beside 1 = %.2f\n",
			be.name(), nPol, many/one, one/none, worst/one, nCluster, nPol, manyCluster/oneCluster)
	}
	return nil
}
