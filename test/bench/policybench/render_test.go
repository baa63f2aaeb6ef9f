package main

import (
	"testing"

	"github.com/weftnet/weft/policy"
	polipt "github.com/weftnet/weft/policy/iptables"
	polnft "github.com/weftnet/weft/policy/nftables"
)

func BenchmarkRender(b *testing.B) {
	in := world(2000)
	in.Policies = scalePolicies(1000)
	d := policy.Compile(in)
	for b.Loop() {
		polipt.Render(d, polipt.Config{NodeName: nodeName})
	}
}

func BenchmarkRenderNFTables(b *testing.B) {
	in := world(2000)
	in.Policies = scalePolicies(1000)
	d := policy.Compile(in)
	for b.Loop() {
		polnft.Render(d, polnft.Config{NodeName: nodeName})
	}
}
