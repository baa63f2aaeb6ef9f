// Command policybench measures weft's NetworkPolicy enforcement at scale:
//
//   - compile: policy.Compile over -policies NetworkPolicies and
//     -cluster-policies ClusterNetworkPolicies (both tiers) and -pods pods
//     (median of -runs);
//   - render: each backend's Render (policy/iptables, policy/nftables) of
//     the result for a node holding every pod (the worst case for one node);
//   - apply: the first Applier.Apply into an empty kernel (iptables: ipsets
//   - one iptables-restore; nftables: one nft transaction), then an apply
//     after one policy edit and after one pod relabel (medians);
//   - connection rate through an isolated pod (sequential TCP connections,
//     each a NEW conntrack entry walking the policy chains) with no policy,
//     with 1 policy, and with -policies policies all selecting that pod and
//     each allowing other peers (the allowing one sorted last); the ratio
//     1,000 : 1 shows whether the pod's chain stays flat; then with
//     -cluster-policies Admin ClusterNetworkPolicies selecting the pod
//     beside the policies (none matching the client: every one is walked)
//     against 1 beside 1.
//
// There is no upstream NetworkPolicy peer available on this machine to
// compare with (kube-proxy has no policy), so the report gives weft's
// absolute numbers and its own ratios.
//
// Usage (root, repository root):
//
//	go run ./test/bench/policybench [-policies 1000] [-cluster-policies 1000] [-pods 2000] [-conns 3000] [-runs 5] [-backends iptables,nftables]
//
// Everything runs in a private network and mount namespace
// (netnsutil.Isolate).
package main

import (
	"context"
	"flag"
	"slices"
	"time"

	"github.com/weftnet/weft/test/bench/benchlab"
)

func main() {
	nPol := flag.Int("policies", 1000, "NetworkPolicies")
	nCluster := flag.Int("cluster-policies", 1000, "ClusterNetworkPolicies beside them")
	nPods := flag.Int("pods", 2000, "pods")
	conns := flag.Int("conns", 3000, "TCP connections per rate measurement")
	runs := flag.Int("runs", 5, "repetitions (medians are reported)")
	names := flag.String("backends", "iptables,nftables", "policy backends measured, comma-separated: iptables, nftables")
	flag.Parse()
	benchlab.Main("policybench", func(context.Context) error { return run(*nPol, *nCluster, *nPods, *conns, *runs, *names) })
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func medianF(f []float64) float64 {
	s := slices.Clone(f)
	slices.Sort(s)
	return s[len(s)/2]
}
