package iptables

import (
	"errors"
	"fmt"

	"github.com/weftnet/weft/proxy/model"
)

// Backend is the iptables service proxy backend: it renders the model for
// each IP family and applies only what changed, in one iptables-restore
// transaction per family.
type Backend struct {
	cfg       Config
	appliers  []*Applier
	renderers []*Renderer
	// LastStats are the stats of the last sync, per family.
	LastStats []Stats
}

// New returns a backend programming the given families (4 and/or 6).
func New(cfg Config, families []int, r Runner) *Backend {
	b := &Backend{cfg: cfg}
	for _, f := range families {
		b.appliers = append(b.appliers, &Applier{Family: f, Runner: r})
		b.renderers = append(b.renderers, NewRenderer(cfg, f))
	}
	return b
}

// SetChunkRules bounds the rules of one iptables-restore (see Applier).
func (b *Backend) SetChunkRules(n int) {
	for _, a := range b.appliers {
		a.ChunkRules = n
	}
}

// Render returns the rulesets Sync would apply (for --dry-run).
func (b *Backend) Render(st model.State) []*Ruleset {
	var out []*Ruleset
	for _, a := range b.appliers {
		out = append(out, Render(b.cfg, st, a.Family))
	}
	return out
}

// Sync renders and applies st.
func (b *Backend) Sync(st model.State, full bool) error {
	var errs []error
	b.LastStats = b.LastStats[:0]
	for i, a := range b.appliers {
		s, err := a.Apply(b.renderers[i].Update(st), full)
		b.LastStats = append(b.LastStats, s)
		if err != nil {
			errs = append(errs, fmt.Errorf("syncing iptables (IPv%d): %w", a.Family, err))
		}
	}
	return errors.Join(errs...)
}

// Cleanup removes every chain and jump of the proxy.
func (b *Backend) Cleanup() error {
	var errs []error
	for _, a := range b.appliers {
		if err := a.Cleanup(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// builtins are the built-in chains of each table, declared in Payload.
var builtins = map[string][]string{
	TableNAT:    {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
	TableFilter: {"INPUT", "FORWARD", "OUTPUT"},
}

// Payload renders a ruleset as iptables-save would show it on a node with
// nothing else installed, preceded by the hairpin set as ipset save shows
// it (for --dry-run and the packet tracer).
func Payload(rs *Ruleset) string {
	var out []byte
	fam := "inet"
	if rs.Family == 6 {
		fam = "inet6"
	}
	set := HairpinSet(rs.Family)
	out = fmt.Appendf(out, "create %s hash:ip,port,ip family %s\n", set, fam)
	for _, e := range rs.Hairpin() {
		out = fmt.Appendf(out, "add %s %s\n", set, e)
	}
	for _, table := range []string{TableNAT, TableFilter} {
		out = fmt.Appendf(out, "*%s\n", table)
		for _, c := range builtins[table] {
			out = fmt.Appendf(out, ":%s ACCEPT [0:0]\n", c)
		}
		for _, c := range rs.Chains {
			if c.Table == table {
				out = fmt.Appendf(out, ":%s - [0:0]\n", c.Name)
			}
		}
		for _, c := range rs.Chains {
			if c.Table == table {
				for _, r := range c.Rules {
					out = fmt.Appendf(out, "-A %s %s\n", c.Name, r)
				}
			}
		}
		for _, j := range rs.Jumps {
			if j.Table == table {
				out = fmt.Appendf(out, "-A %s %s\n", j.Chain, j.Rule)
			}
		}
		out = append(out, "COMMIT\n"...)
	}
	return string(out)
}
