package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/weftnet/weft/policy"
	polipt "github.com/weftnet/weft/policy/iptables"
	polnft "github.com/weftnet/weft/policy/nftables"
)

// backend is one policy data plane under measurement.
type backend interface {
	name() string
	// render renders d for the node; describe says what came out.
	render(d policy.Desired) rendered
	apply(r rendered) error
	cleanup() error
	// applyWhat names what a first apply runs.
	applyWhat() string
}

// rendered is a backend's render of one state.
type rendered interface {
	// describe is its size.
	describe() string
	// path is the number of rules a new connection to the bench's server
	// walks in its ingress chain.
	path() int
}

func backends(names string) ([]backend, error) {
	var out []backend
	for _, n := range strings.Split(names, ",") {
		switch n {
		case "iptables":
			out = append(out, &iptablesBackend{})
		case "nftables":
			a, err := polnft.New(context.Background())
			if err != nil {
				return nil, err
			}
			out = append(out, &nftablesBackend{a: a})
		default:
			return nil, fmt.Errorf("-backends: %q is neither iptables nor nftables", n)
		}
	}
	return out, nil
}

type iptablesBackend struct{ a polipt.Applier }

type iptablesRendered struct{ *polipt.Ruleset }

func (*iptablesBackend) name() string { return "iptables" }
func (*iptablesBackend) applyWhat() string {
	return "ipset restore + iptables-restore"
}

func (*iptablesBackend) render(d policy.Desired) rendered {
	return iptablesRendered{polipt.Render(d, polipt.Config{NodeName: nodeName})}
}

func (b *iptablesBackend) apply(r rendered) error {
	_, err := b.a.Apply(r.(iptablesRendered).Ruleset)
	return err
}

func (b *iptablesBackend) cleanup() error {
	b.a = polipt.Applier{}
	return b.a.Cleanup()
}

func (r iptablesRendered) describe() string {
	rules, members := 0, 0
	for _, c := range r.Chains {
		rules += len(c.Rules)
	}
	for _, s := range r.Sets {
		members += len(s.Members)
	}
	return fmt.Sprintf("%d chains, %d rules, %d ipsets with %d members", len(r.Chains), rules, len(r.Sets), members)
}

func (r iptablesRendered) path() int {
	for _, ch := range r.Chains {
		if strings.HasPrefix(ch.Name, "WEFT-POL-I-") {
			return len(ch.Rules)
		}
	}
	return 0
}

type nftablesBackend struct{ a *polnft.Applier }

type nftablesRendered struct{ *polnft.Ruleset }

func (*nftablesBackend) name() string      { return "nftables" }
func (*nftablesBackend) applyWhat() string { return "one nft transaction" }

func (*nftablesBackend) render(d policy.Desired) rendered {
	return nftablesRendered{polnft.Render(d, polnft.Config{NodeName: nodeName})}
}

func (b *nftablesBackend) apply(r rendered) error {
	_, err := b.a.Apply(context.Background(), r.(nftablesRendered).Ruleset)
	return err
}

func (b *nftablesBackend) cleanup() error { return b.a.Cleanup(context.Background()) }

func (r nftablesRendered) describe() string {
	rules, elements := 0, 0
	for _, c := range r.Inet.Chains {
		rules += len(c.Rules)
	}
	for _, s := range r.Inet.Sets {
		elements += len(s.Elements)
	}
	return fmt.Sprintf("%d chains, %d rules, %d sets and maps with %d elements", len(r.Inet.Chains), rules, len(r.Inet.Sets), elements)
}

// path: the server's ingress group chain (reached by one verdict map
// lookup), the only one whose name starts with the ingress prefix.
func (r nftablesRendered) path() int {
	n := 0
	for _, ch := range r.Inet.Chains {
		if strings.HasPrefix(ch.Name, "in-") {
			n = len(ch.Rules)
		}
	}
	return n
}
