package ebpf

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	"github.com/weftnet/weft/proxy/iptables"
)

// The per-packet path translates only destinations (see bpf/nodeport.c):
// the kernel forwards the packets, so NetworkPolicy in filter FORWARD sees
// them, and a constant set of glue rules, the same for any number of
// Services, masquerades those the program marked (eTP Cluster). They live
// in chainMasq of the nat table, jumped to from POSTROUTING, for every
// family the node has.
const chainMasq = "WEFT-EBPF-POSTROUTING"

// jumpComment names weft's jump from POSTROUTING, which cleanup finds by it.
const jumpComment = "weft ebpf: masquerade external service traffic"

// masqPorts are the source ports masquerading picks: outside the NodePort
// range (30000-32767 by default), so that the reply of a flow to a backend
// on another node, which reaches the uplink's program before conntrack
// undoes the masquerade, is never taken for a new flow to a NodePort; the
// kernel's default range of local ports, which NodePorts stay out of for
// the same reason.
const masqPorts = "32768-60999"

// masqRules are the rules of chainMasq for mark bit mark: packets without
// it return; the others lose it (a packet is masqueraded once) and are
// masqueraded, from the address the route toward the backend gives.
func masqRules(mark uint32) []string {
	rules := []string{
		fmt.Sprintf("-m mark ! --mark %#x/%#x -j RETURN", mark, mark),
		fmt.Sprintf("-j MARK --xor-mark %#x", mark),
	}
	for _, proto := range []string{"tcp", "udp"} {
		rules = append(rules, fmt.Sprintf(`-p %s -m comment --comment "weft ebpf: external service traffic requiring SNAT" -j MASQUERADE --to-ports %s --random-fully`, proto, masqPorts))
	}
	return rules
}

// installMasq writes chainMasq (flushed and refilled: idempotent) and
// the jump to it from POSTROUTING unless it is there already.
func installMasq(ipt iptables.Exec, families []int, mark uint32) error {
	for _, fam := range families {
		saved, err := ipt.Save(fam, "nat")
		if err != nil {
			return fmt.Errorf("masquerade rules (IPv%d): %w", fam, err)
		}
		var p bytes.Buffer
		fmt.Fprintf(&p, "*nat\n:%s - [0:0]\n", chainMasq)
		for _, r := range masqRules(mark) {
			fmt.Fprintf(&p, "-A %s %s\n", chainMasq, r)
		}
		if len(jumps(saved)) == 0 {
			fmt.Fprintf(&p, "-I POSTROUTING 1 -m comment --comment %q -j %s\n", jumpComment, chainMasq)
		}
		p.WriteString("COMMIT\n")
		if err := ipt.Restore(fam, p.Bytes()); err != nil {
			return fmt.Errorf("masquerade rules (IPv%d): %w", fam, err)
		}
	}
	return nil
}

// removeMasq deletes the jumps to chainMasq and the chain, in every
// family where they are; other rules stay.
func removeMasq(ipt iptables.Exec, families []int) error {
	var errs []error
	for _, fam := range families {
		saved, err := ipt.Save(fam, "nat")
		if err != nil {
			errs = append(errs, fmt.Errorf("cleanup: masquerade rules (IPv%d): %w", fam, err))
			continue
		}
		js := jumps(saved)
		if len(js) == 0 && !bytes.Contains(saved, []byte(":"+chainMasq+" ")) {
			continue
		}
		var p bytes.Buffer
		fmt.Fprintf(&p, "*nat\n:%s - [0:0]\n", chainMasq)
		for _, j := range js {
			fmt.Fprintf(&p, "-D %s\n", strings.TrimPrefix(j, "-A "))
		}
		fmt.Fprintf(&p, "-X %s\nCOMMIT\n", chainMasq)
		if err := ipt.Restore(fam, p.Bytes()); err != nil {
			errs = append(errs, fmt.Errorf("cleanup: masquerade rules (IPv%d): %w", fam, err))
		}
	}
	return errors.Join(errs...)
}

// jumps are the rules of POSTROUTING in an iptables-save dump of the nat
// table that jump to chainMasq, as saved.
func jumps(saved []byte) []string {
	var out []string
	for _, line := range strings.Split(string(saved), "\n") {
		if strings.HasPrefix(line, "-A POSTROUTING ") && strings.HasSuffix(line, "-j "+chainMasq) {
			out = append(out, line)
		}
	}
	return out
}
