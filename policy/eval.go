package policy

import "net/netip"

// Allows evaluates the compiled rules for one new connection from src to
// dst:port/proto, as the backends enforce them: the source pod's egress
// rules, then the destination pod's ingress rules. Traffic of a pod to its
// own address never leaves the pod and is allowed.
func (d Desired) Allows(src, dst netip.Addr, proto Protocol, port uint16) bool {
	s, d2 := d.pod(src), d.pod(dst)
	if s != nil && s == d2 {
		return true
	}
	if s != nil && s.Egress.Isolated && !d.any(s.Egress.Rules, dst, proto, port) {
		return false
	}
	if d2 != nil && d2.Ingress.Isolated && !d.any(d2.Ingress.Rules, src, proto, port) {
		return false
	}
	return true
}

func (d Desired) pod(ip netip.Addr) *PodRules {
	for i := range d.Pods {
		for _, a := range d.Pods[i].IPs {
			if a == ip {
				return &d.Pods[i]
			}
		}
	}
	return nil
}

func (d Desired) any(rules []Rule, peer netip.Addr, proto Protocol, port uint16) bool {
	for _, r := range rules {
		if d.matches(r, peer, proto, port) {
			return true
		}
	}
	return false
}

func (d Desired) matches(r Rule, peer netip.Addr, proto Protocol, port uint16) bool {
	if len(r.Ports) > 0 {
		ok := false
		for _, p := range r.Ports {
			ok = ok || p.Matches(proto, port)
		}
		if !ok {
			return false
		}
	}
	if r.AllPeers {
		return true
	}
	for _, id := range r.Peers {
		if d.Sets[id].Contains(peer) {
			return true
		}
	}
	return false
}
