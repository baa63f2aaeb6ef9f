package userspace

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/weftnet/weft/proxy/iptables"
	"github.com/weftnet/weft/proxy/model"
)

// The iptables glue's chains. Built-in chains jump to them (iptablesJumps);
// nothing else of the node is touched.
const (
	// nat: a REDIRECT per frontend (PREROUTING, OUTPUT).
	chainRedirect = "WEFT-USERSPACE"
	// filter: drops and rejects (INPUT, FORWARD, OUTPUT), matched on the
	// connection's original destination, so before or after a REDIRECT.
	chainFilter = "WEFT-USERSPACE"
	// filter: loadBalancerSourceRanges, allowed sources RETURN.
	chainFirewall = "WEFT-USERSPACE-FIREWALL"
	// filter: externalTrafficPolicy Local drops, pods and the node RETURN.
	chainExternal = "WEFT-USERSPACE-EXTERNAL"
	// filter: the guard of the listeners' ports (INPUT).
	chainGuard = "WEFT-USERSPACE-INPUT"
)

// IPTablesJump is a rule in a built-in chain leading to one of the glue's.
type IPTablesJump struct{ Table, Chain, Target string }

func (j IPTablesJump) rule() string { return "-A " + j.Chain + " -j " + j.Target }

var iptablesJumps = []IPTablesJump{
	{"nat", "PREROUTING", chainRedirect}, {"nat", "OUTPUT", chainRedirect},
	{"filter", "INPUT", chainGuard}, {"filter", "INPUT", chainFilter},
	{"filter", "FORWARD", chainFilter}, {"filter", "OUTPUT", chainFilter},
}

// iptablesChains are the glue's chains by table.
var iptablesChains = map[string][]string{
	"nat":    {chainRedirect},
	"filter": {chainFilter, chainFirewall, chainExternal, chainGuard},
}

// RenderIPTables is the iptables-restore --noflush payload of g for one
// family (4 or 6): it rewrites every chain of the glue, and inserts the
// jumps in missing (those not yet in the built-in chains). It is pure.
func RenderIPTables(g GlueSpec, fam int, clusterCIDRs []netip.Prefix, missing []IPTablesJump) string {
	var b strings.Builder
	bits := "/32"
	if fam == 6 {
		bits = "/128"
	}
	proto := func(p model.Protocol) string { return strings.ToLower(string(p)) }
	// orig matches a frontend as the connection's original destination,
	// which a REDIRECT does not change.
	orig := func(f Frontend, state string) string {
		return fmt.Sprintf("-p %s -m conntrack %s--ctorigdst %s%s --ctorigdstport %d", proto(f.Protocol), state, f.Addr, bits, f.Port)
	}
	header := func(table string) {
		fmt.Fprintf(&b, "*%s\n", table)
		for _, c := range iptablesChains[table] {
			fmt.Fprintf(&b, ":%s - [0:0]\n", c)
		}
	}
	jumps := func(table string) {
		for _, j := range missing {
			if j.Table == table {
				fmt.Fprintf(&b, "-I %s 1 -j %s\n", j.Chain, j.Target)
			}
		}
		b.WriteString("COMMIT\n")
	}

	header("nat")
	for _, r := range family(g.Redirect, fam) {
		fmt.Fprintf(&b, "-A %s -d %s%s -p %s -m %s --dport %d -j REDIRECT --to-ports %d\n",
			chainRedirect, r.Addr, bits, proto(r.Protocol), proto(r.Protocol), r.Port, r.To)
	}
	jumps("nat")

	header("filter")
	fw, ext := family(g.Firewall, fam), family(g.DropExternal, fam)
	if len(fw) > 0 {
		fmt.Fprintf(&b, "-A %s -m conntrack --ctstate NEW -j %s\n", chainFilter, chainFirewall)
	}
	if len(ext) > 0 {
		fmt.Fprintf(&b, "-A %s -m conntrack --ctstate NEW -j %s\n", chainFilter, chainExternal)
	}
	for _, f := range family(g.Drop, fam) {
		fmt.Fprintf(&b, "-A %s %s -j DROP\n", chainFilter, orig(f, "--ctstate NEW "))
	}
	for _, f := range family(g.Reject, fam) {
		fmt.Fprintf(&b, "-A %s %s -j REJECT\n", chainFilter, orig(f, "--ctstate NEW "))
	}
	for _, f := range fw {
		for _, r := range f.SourceRanges {
			fmt.Fprintf(&b, "-A %s -s %s %s -j RETURN\n", chainFirewall, r, orig(f, ""))
		}
		fmt.Fprintf(&b, "-A %s %s -j DROP\n", chainFirewall, orig(f, ""))
	}
	if len(ext) > 0 {
		for _, c := range clusterCIDRs {
			if (fam == 6) == c.Addr().Is6() {
				fmt.Fprintf(&b, "-A %s -s %s -j RETURN\n", chainExternal, c.Masked())
			}
		}
		fmt.Fprintf(&b, "-A %s -m addrtype --src-type LOCAL -j RETURN\n", chainExternal)
		for _, f := range ext {
			fmt.Fprintf(&b, "-A %s %s -j DROP\n", chainExternal, orig(f, ""))
		}
	}
	for _, gd := range g.Guard {
		if gd.Protocol == model.SCTP {
			continue
		}
		fmt.Fprintf(&b, "-A %s -p %s -m %s --dport %d -m conntrack --ctstate NEW -m conntrack ! --ctstate DNAT -j DROP\n",
			chainGuard, proto(gd.Protocol), proto(gd.Protocol), gd.Port)
	}
	jumps("filter")
	return b.String()
}

// iptablesGlue applies the glue with iptables-restore, per family.
type iptablesGlue struct {
	runner       iptables.Runner
	families     []int
	clusterCIDRs []netip.Prefix
	// jumped: the jumps were seen or inserted by an earlier apply (a full
	// apply looks again).
	jumped map[int]bool
}

func (ig *iptablesGlue) apply(g GlueSpec, full bool) error {
	if ig.jumped == nil {
		ig.jumped = map[int]bool{}
	}
	var errs []error
	for _, fam := range ig.families {
		var missing []IPTablesJump
		if full || !ig.jumped[fam] {
			have, err := ig.saved(fam)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			for _, j := range iptablesJumps {
				if !strings.Contains(have[j.Table], "\n"+j.rule()+"\n") {
					missing = append(missing, j)
				}
			}
		}
		if err := ig.runner.Restore(fam, []byte(RenderIPTables(g, fam, ig.clusterCIDRs, missing))); err != nil {
			ig.jumped[fam] = false
			errs = append(errs, fmt.Errorf("IPv%d: %w", fam, err))
			continue
		}
		ig.jumped[fam] = true
	}
	return errors.Join(errs...)
}

// saved is iptables-save of the glue's tables, by table.
func (ig *iptablesGlue) saved(fam int) (map[string]string, error) {
	out := map[string]string{}
	for _, t := range []string{"nat", "filter"} {
		s, err := ig.runner.Save(fam, t)
		if err != nil {
			return nil, err
		}
		out[t] = "\n" + string(s)
	}
	return out, nil
}

// cleanup removes the jumps and the chains, whatever an earlier process
// left; a family without them is left alone.
func (ig *iptablesGlue) cleanup() error {
	var errs []error
	for _, fam := range ig.families {
		have, err := ig.saved(fam)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var b bytes.Buffer
		for _, table := range []string{"nat", "filter"} {
			var mine []string
			for _, c := range iptablesChains[table] {
				if strings.Contains(have[table], "\n:"+c+" ") {
					mine = append(mine, c)
				}
			}
			if len(mine) == 0 {
				continue
			}
			fmt.Fprintf(&b, "*%s\n", table)
			for _, c := range mine {
				fmt.Fprintf(&b, ":%s - [0:0]\n", c) // declared: flushed
			}
			for _, j := range iptablesJumps {
				if j.Table == table && strings.Contains(have[table], "\n"+j.rule()+"\n") {
					fmt.Fprintf(&b, "-D %s -j %s\n", j.Chain, j.Target)
				}
			}
			for _, c := range mine {
				fmt.Fprintf(&b, "-X %s\n", c)
			}
			b.WriteString("COMMIT\n")
		}
		if b.Len() == 0 {
			continue
		}
		if err := ig.runner.Restore(fam, b.Bytes()); err != nil {
			errs = append(errs, fmt.Errorf("IPv%d: %w", fam, err))
		}
	}
	ig.jumped = nil
	return errors.Join(errs...)
}
