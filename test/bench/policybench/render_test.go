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

// BenchmarkCompileWithClusterPolicies compiles 1,000 NetworkPolicies and
// 1,000 ClusterNetworkPolicies over 2,000 pods.
func BenchmarkCompileWithClusterPolicies(b *testing.B) {
	in := clusterPolicyWorld()
	for b.Loop() {
		policy.Compile(in)
	}
}

// clusterPolicyWorld is 2,000 pods with 1,000 NetworkPolicies and 1,000
// ClusterNetworkPolicies.
func clusterPolicyWorld() policy.Input {
	in := world(2000)
	in.Policies = scalePolicies(1000)
	in.ClusterPolicies = scaleClusterPolicies(1000)
	return in
}

// BenchmarkRenderNFTablesWithClusterPolicies renders that state.
func BenchmarkRenderNFTablesWithClusterPolicies(b *testing.B) {
	d := policy.Compile(clusterPolicyWorld())
	for b.Loop() {
		polnft.Render(d, polnft.Config{NodeName: nodeName})
	}
}

// BenchmarkRenderWithClusterPolicies renders that state with the
// iptables backend.
func BenchmarkRenderWithClusterPolicies(b *testing.B) {
	d := policy.Compile(clusterPolicyWorld())
	for b.Loop() {
		polipt.Render(d, polipt.Config{NodeName: nodeName})
	}
}
