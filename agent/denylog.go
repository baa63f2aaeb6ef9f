package agent

import (
	"context"
	"log/slog"
	"net/netip"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/nflog"
	"github.com/weftnet/weft/policy"
)

// The deny log (--policy-log-drops). The policy backends send the packets
// their drop chains drop, rate-limited in the kernel (10 a second, bursts
// of 20), to nflog group DropLogGroup; the agent reads them and explains
// each with the state it last applied (policy.Desired.Explain: the same
// compiler and evaluation the rules come from), so a record names what
// denied: the ClusterNetworkPolicy rule (tier, name, priority, rule) or
// the NetworkPolicies isolating the pod. Records are JSON lines on the
// agent's standard error; weft_policy_denied_total counts them.

// DropLogGroup is the nflog group of logged drops.
const DropLogGroup = 7710

// maxDeniedSeries bounds weft_policy_denied_total's label sets; past it a
// record counts under policy "other".
const maxDeniedSeries = 500

// denyLog explains logged drops.
type denyLog struct {
	mu     sync.Mutex
	d      policy.Desired
	pods   map[netip.Addr]string // address -> namespace/name
	series map[[3]string]bool
}

// update takes the state a sync applied.
func (l *denyLog) update(d policy.Desired, pods map[netip.Addr]string) {
	l.mu.Lock()
	l.d, l.pods = d, pods
	l.mu.Unlock()
}

// DenyRecord is one denied connection attempt as the deny log writes it.
type DenyRecord struct {
	Node, Direction string
	Src, Dst        netip.Addr
	SrcPod, DstPod  string // namespace/name, empty for an address no pod has
	Protocol        string
	Port            uint16
	// What denied: the tier, and the ClusterNetworkPolicy rule (Policy,
	// Priority, Rule) or the NetworkPolicies isolating the pod
	// (Policies); Tier empty when the state applied then is not known
	// to deny the packet (it changed since).
	Tier     policy.Tier
	Policy   string
	Priority int32
	Rule     string
	Policies []string
}

// explain turns a logged packet into a record; false for a packet that
// is not a drop of the policy chains.
func (l *denyLog) explain(node string, p nflog.Packet) (DenyRecord, bool) {
	dir, ok := strings.CutPrefix(p.Prefix, policy.DropLogPrefix)
	f, parsed := nflog.ParseFlow(p.Payload)
	if !ok || !parsed || (dir != "ingress" && dir != "egress") {
		return DenyRecord{}, false
	}
	r := DenyRecord{Node: node, Direction: dir, Src: f.Src.Unmap(), Dst: f.Dst.Unmap(), Protocol: protocolName(f.Protocol), Port: f.Port}
	l.mu.Lock()
	d, pods := l.d, l.pods
	l.mu.Unlock()
	r.SrcPod, r.DstPod = pods[r.Src], pods[r.Dst]
	x := d.Explain(r.Src, r.Dst, policy.Protocol(r.Protocol), r.Port)
	dec := x.Ingress
	if dir == "egress" {
		dec = x.Egress
	}
	if dec != nil && !dec.Allowed {
		r.Tier = dec.Tier
		if dec.Tier == policy.TierNetworkPolicy {
			r.Policies = dec.Policies
		} else {
			r.Policy, r.Priority, r.Rule = dec.Policy, dec.Priority, dec.Rule
		}
	}
	return r, true
}

// label is the record's policy label of weft_policy_denied_total.
func (l *denyLog) label(r DenyRecord) [3]string {
	name := r.Policy
	if r.Tier == policy.TierNetworkPolicy {
		name = strings.Join(r.Policies, ",")
	}
	key := [3]string{r.Direction, string(r.Tier), name}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.series == nil {
		l.series = map[[3]string]bool{}
	}
	if !l.series[key] && len(l.series) >= maxDeniedSeries {
		key[2] = "other"
		return key
	}
	l.series[key] = true
	return key
}

func protocolName(p uint8) string {
	switch p {
	case unix.IPPROTO_TCP:
		return string(policy.TCP)
	case unix.IPPROTO_UDP:
		return string(policy.UDP)
	case unix.IPPROTO_SCTP:
		return string(policy.SCTP)
	case unix.IPPROTO_ICMP:
		return "ICMP"
	case unix.IPPROTO_ICMPV6:
		return "ICMPv6"
	}
	return strconv.Itoa(int(p))
}

// RunDenyLog reads the logged drops of the node's policy chains until ctx
// ends, writing each as a JSON record to out.
func (c *PolicyController) RunDenyLog(ctx context.Context, out *slog.Logger) error {
	r, err := nflog.Open(DropLogGroup)
	if err != nil {
		return err
	}
	go func() {
		<-ctx.Done()
		r.Close()
	}()
	for {
		ps, err := r.Read()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		for _, p := range ps {
			rec, ok := c.deny.explain(c.opts.NodeName, p)
			if !ok {
				continue
			}
			label := c.deny.label(rec)
			c.metrics.denied.WithLabelValues(label[:]...).Inc()
			attrs := []any{"node", rec.Node, "direction", rec.Direction, "src", rec.Src, "srcPod", rec.SrcPod, "dst", rec.Dst, "dstPod", rec.DstPod,
				"protocol", rec.Protocol, "port", rec.Port, "tier", rec.Tier}
			if rec.Tier == policy.TierNetworkPolicy {
				attrs = append(attrs, "networkPolicies", rec.Policies)
			} else if rec.Policy != "" {
				attrs = append(attrs, "clusterNetworkPolicy", rec.Policy, "priority", rec.Priority, "rule", rec.Rule)
			}
			out.Info("connection denied by policy", attrs...)
		}
	}
}
