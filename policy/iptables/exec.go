package iptables

import (
	"bytes"
	"fmt"
	"os/exec"
	"strings"

	"github.com/weftnet/weft/internal/sysctl"
)

// Exec runs ipset and the iptables tools of one family (ip6tables-* for 6).
type Exec struct{ Family int }

func (e Exec) tool(name string) string {
	if e.Family == 6 {
		return strings.Replace(name, "iptables", "ip6tables", 1)
	}
	return name
}

// IPSetRestore runs `ipset restore`.
func (Exec) IPSetRestore(payload []byte) error {
	cmd := exec.Command("ipset", "restore")
	cmd.Stdin = bytes.NewReader(payload)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ipset restore: %w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// IPSetNames lists the sets.
func (Exec) IPSetNames() ([]string, error) {
	out, err := exec.Command("ipset", "list", "-n").Output()
	if err != nil {
		return nil, fmt.Errorf("ipset list: %w", err)
	}
	return strings.Fields(string(out)), nil
}

// IPTablesRestore applies a payload without flushing what it does not name.
func (e Exec) IPTablesRestore(payload []byte) error {
	cmd := exec.Command(e.tool("iptables-restore"), "--noflush", "-w", "5")
	cmd.Stdin = bytes.NewReader(payload)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w: %s", e.tool("iptables-restore"), err, bytes.TrimSpace(out))
	}
	return nil
}

// FirstRule prints rule 1 of a filter chain ("-A CHAIN ..." without the
// prefix); "" when the chain is empty.
func (e Exec) FirstRule(chain string) (string, error) {
	out, err := exec.Command(e.tool("iptables"), "-w", "5", "-t", "filter", "-S", chain, "1").CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "Index of deletion too big") || strings.Contains(string(out), "Bad rule") {
			return "", nil
		}
		return "", fmt.Errorf("%s -S %s 1: %w: %s", e.tool("iptables"), chain, err, bytes.TrimSpace(out))
	}
	line := strings.TrimSpace(string(out))
	_, rule, _ := strings.Cut(strings.TrimPrefix(line, "-A "+chain), " ")
	if !strings.HasPrefix(line, "-A ") {
		return "", nil
	}
	return rule, nil
}

// IPTablesSave dumps the filter table with counters.
func (e Exec) IPTablesSave() ([]byte, error) {
	out, err := exec.Command(e.tool("iptables-save"), "-c", "-t", "filter").Output()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", e.tool("iptables-save"), err)
	}
	return out, nil
}

// BridgeNetfilter is the sysctl that shows bridged (same-node) pod traffic
// to iptables; BridgeNetfilter6 to ip6tables.
const (
	BridgeNetfilter  = "net.bridge.bridge-nf-call-iptables"
	BridgeNetfilter6 = "net.bridge.bridge-nf-call-ip6tables"
)

// EnsureBridgeNetfilter sets BridgeNetfilter (6) to 1 unless it is 1
// already; it fails, naming the sysctl, when bridge netfilter is missing
// (same-node traffic would escape the policies) or the value is not 1 and
// cannot be written.
func (e Exec) EnsureBridgeNetfilter() error {
	name := BridgeNetfilter
	if e.Family == 6 {
		name = BridgeNetfilter6
	}
	if err := sysctl.Ensure(name, "1"); err != nil {
		return fmt.Errorf("enabling bridge netfilter (same-node pod traffic must be seen by the policies): %w", err)
	}
	return nil
}
