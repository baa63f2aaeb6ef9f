package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"sync/atomic"
	"time"

	"github.com/weftnet/weft/policy"
	polipt "github.com/weftnet/weft/policy/iptables"
	polnft "github.com/weftnet/weft/policy/nftables"
	"github.com/weftnet/weft/policy/readyset"
)

// The policy modes: the data plane that enforces NetworkPolicy.
const (
	PolicyModeIPTables = "iptables" // iptables chains and ipsets (policy/iptables)
	PolicyModeNFTables = "nftables" // weft's nftables tables (policy/nftables)
)

// policyBackend is what the controller needs of a policy data plane: the
// compiled state applied for this node, and the ready sets of new pods'
// default deny (see policy_pending.go).
type policyBackend interface {
	// apply programs d; v6 says the node has IPv6 pods (a backend may
	// start its IPv6 side only then).
	apply(d policy.Desired, cfg policyConfig, v6 bool) (applyResult, error)
	// readyMade says the ready sets exist (of both families when v6).
	readyMade(v6 bool) bool
	readyMembers(v6 bool) (map[netip.Addr]bool, error)
	readyAdd(addrs []netip.Addr) error
	readyDel(addrs []netip.Addr) error
	// forceFull makes the next apply read the kernel back (drift repair).
	forceFull()
	cleanup() error
	drops() (in, out uint64, err error)
}

// policyConfig is the node's side of a render: with sources (the pods'
// bridge ports and addresses, from the plugin's allocations) the source
// check and new pods' default deny are on.
type policyConfig struct {
	node     string
	logDrops bool
	sources  []podSource
	bridge   string
}

// podSource is one pod attachment: its bridge port and its addresses.
type podSource struct {
	Port  string
	Addrs []netip.Addr
}

// applyResult is what an apply changed (log fields; none: nothing) and
// how many sets the rules use.
type applyResult struct {
	changes []any
	sets    int
}

func newPolicyBackend(mode string) (policyBackend, error) {
	switch mode {
	case "", PolicyModeIPTables:
		return &iptablesPolicy{v4: polipt.Applier{Runner: polipt.Exec{}}, v6: polipt.Applier{Family: 6, Runner: polipt.Exec{Family: 6}}}, nil
	case PolicyModeNFTables:
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		a, err := polnft.New(ctx)
		if err != nil {
			return nil, err
		}
		return &nftablesPolicy{a: a, ready: polnft.ReadySet{NFT: a.Inet}}, nil
	}
	return nil, fmt.Errorf("policy mode %q is neither %s nor %s", mode, PolicyModeIPTables, PolicyModeNFTables)
}

// iptablesPolicy is policy/iptables: an applier per family, the IPv6 one
// from the first local IPv6 pod on; the ready sets are ipsets.
type iptablesPolicy struct {
	v4, v6 polipt.Applier
	// v6On: the IPv6 side runs (read by the metrics too).
	v6On     atomic.Bool
	setsMade [7]bool // by family: an apply has created the ready set
}

func (b *iptablesPolicy) apply(d policy.Desired, pc policyConfig, v6 bool) (applyResult, error) {
	cfg := polipt.Config{NodeName: pc.node, LogDrops: pc.logDrops, LogGroup: DropLogGroup}
	if pc.sources != nil {
		cfg.PodPorts, cfg.PodBridges = podPorts, []string{pc.bridge}
		for _, s := range pc.sources {
			cfg.Sources = append(cfg.Sources, polipt.Source{Port: s.Port, Addrs: s.Addrs})
		}
	}
	rs := polipt.Render(d, cfg)
	st, err := b.v4.Apply(rs)
	if err != nil {
		return applyResult{}, err
	}
	b.setsMade[4] = true
	sets := len(rs.Sets)
	if v6 || b.v6On.Load() { // from the first local IPv6 pod on, for good (so it also cleans up)
		b.v6On.Store(true)
		cfg.Family = 6
		rs6 := polipt.Render(d, cfg)
		st6, err := b.v6.Apply(rs6)
		if err != nil {
			return applyResult{}, fmt.Errorf("ipv6: %w", err)
		}
		b.setsMade[6] = true
		st.Sets, st.Chains = st.Sets+st6.Sets, st.Chains+st6.Chains
		st.DeletedChains, st.DeletedSets = st.DeletedChains+st6.DeletedChains, st.DeletedSets+st6.DeletedSets
		sets += len(rs6.Sets)
	}
	r := applyResult{sets: sets}
	if st.Sets+st.Chains+st.DeletedChains+st.DeletedSets > 0 {
		r.changes = []any{"setsWritten", st.Sets, "chainsWritten", st.Chains, "chainsDeleted", st.DeletedChains, "setsDeleted", st.DeletedSets}
	}
	return r, nil
}

func (b *iptablesPolicy) readyMade(v6 bool) bool { return b.setsMade[4] && (!v6 || b.setsMade[6]) }

func (b *iptablesPolicy) readyMembers(v6 bool) (map[netip.Addr]bool, error) {
	have, err := readyset.Members(readyset.Name4)
	if err != nil || !v6 {
		return have, err
	}
	have6, err := readyset.Members(readyset.Name6)
	for a := range have6 {
		have[a] = true
	}
	return have, err
}

func (b *iptablesPolicy) readyAdd(addrs []netip.Addr) error { return readyset.Add(addrs) }
func (b *iptablesPolicy) readyDel(addrs []netip.Addr) error { return readyset.Del(addrs) }

func (b *iptablesPolicy) forceFull() {
	b.v4.ForceFull()
	b.v6.ForceFull()
}

// cleanup removes the policy chains, jumps and sets of both families
// (ip6tables missing is no error when nothing was installed).
func (b *iptablesPolicy) cleanup() error {
	err := b.v4.Cleanup()
	if _, lerr := exec.LookPath("ip6tables"); lerr == nil {
		err = errors.Join(err, b.v6.Cleanup())
	}
	return err
}

func (b *iptablesPolicy) drops() (in, out uint64, err error) {
	in, out, err = b.v4.Drops()
	if err != nil || !b.v6On.Load() {
		return in, out, err
	}
	in6, out6, err := b.v6.Drops()
	return in + in6, out + out6, err
}

// nftablesPolicy is policy/nftables: both families in one inet table
// (one transaction per apply), the source check in a bridge table; the
// ready sets are sets of the inet table. No iptables or ipset tool is
// ever run.
type nftablesPolicy struct {
	a     *polnft.Applier
	ready polnft.ReadySet
	made  bool
}

// nftPodPorts is the nft wildcard of the pods' bridge ports.
const nftPodPorts = podPortPrefix + "*"

func (b *nftablesPolicy) apply(d policy.Desired, pc policyConfig, _ bool) (applyResult, error) {
	cfg := polnft.Config{NodeName: pc.node, LogDrops: pc.logDrops, LogGroup: DropLogGroup}
	if pc.sources != nil {
		cfg.PodPorts, cfg.PodBridges = nftPodPorts, []string{pc.bridge}
		for _, s := range pc.sources {
			cfg.Sources = append(cfg.Sources, polnft.Source{Port: s.Port, Addrs: s.Addrs})
		}
	}
	rs := polnft.Render(d, cfg)
	st, err := b.a.Apply(context.Background(), rs)
	if err != nil {
		return applyResult{}, err
	}
	b.made = true
	r := applyResult{sets: len(rs.Inet.Sets)}
	if rs.Bridge != nil {
		r.sets += len(rs.Bridge.Sets)
	}
	if st.Rules+st.ElementAdds+st.ElementDeletes+st.Objects > 0 {
		r.changes = []any{"full", st.Full, "rulesWritten", st.Rules, "elementsAdded", st.ElementAdds, "elementsDeleted", st.ElementDeletes, "objects", st.Objects}
	}
	return r, nil
}

func (b *nftablesPolicy) readyMade(bool) bool { return b.made }

func (b *nftablesPolicy) readyMembers(bool) (map[netip.Addr]bool, error) {
	return b.ready.Members(context.Background())
}

func (b *nftablesPolicy) readyAdd(addrs []netip.Addr) error {
	return b.ready.Add(context.Background(), addrs)
}

func (b *nftablesPolicy) readyDel(addrs []netip.Addr) error {
	return b.ready.Del(context.Background(), addrs)
}

func (b *nftablesPolicy) forceFull() { b.a.ForceFull() }

func (b *nftablesPolicy) cleanup() error {
	b.made = false
	return b.a.Cleanup(context.Background())
}

func (b *nftablesPolicy) drops() (in, out uint64, err error) {
	return b.a.Drops(context.Background())
}
