package agent

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"

	"github.com/weftnet/weft/ipam"
	"github.com/weftnet/weft/policy"
)

// New pods are default-deny until programmed (policy/iptables and
// policy/nftables ChainPending): the controller marks an attachment's
// addresses ready (the backend's ready sets, see policy/readyset) once the chains covering its pod are applied. It ties
// an attachment to its Pod by the pod the plugin recorded with the
// allocation (CNI_ARGS), or by the addresses the API server reports; the
// Pod object exists before its sandbox, so a new pod is programmed on the
// first sync after its ADD. An attachment that stays unknown for
// PendingTimeout is released as a pod no policy selects (counted in
// weft_policy_pending_expired_total and logged).

// DefaultPendingTimeout is the default bound on how long a new attachment
// the agent cannot tie to a Pod stays default-deny.
const DefaultPendingTimeout = 30 * time.Second

// pendingState is what the sync loop remembers about attachments not
// ready yet.
type pendingState struct {
	started bool                   // a sync has run: later attachments are new pods
	first   map[ipam.Key]time.Time // when each attachment not ready yet was first seen
	fresh   map[ipam.Key]bool      // first seen after the first sync: their wait is measured
	timer   *time.Timer            // pokes the loop at the next bound
	// settled is the allocations' fingerprint when the last markReady
	// left every attachment ready: while it holds, syncs skip markReady
	// (the periodic resync clears it).
	settled string
}

// fingerprint identifies a list of allocations (keys and addresses); it
// is never empty, so that the zero settled matches nothing.
func fingerprint(allocs []ipam.Allocation) string {
	var b strings.Builder
	b.WriteString("allocations:")
	for _, al := range allocs {
		b.WriteString(al.Key.String())
		for _, a := range al.Addresses {
			b.WriteString(" " + a.String())
		}
		b.WriteString(";")
	}
	return b.String()
}

// covered are the attachments of this node whose pod the compiled state
// includes with exactly the attachment's addresses.
type covered map[ipam.Key][]netip.Addr

// localPods returns the pods the compiler gets, with the pods of this
// node's attachments given their attachments' addresses (the API server
// reports them only later), and which attachments they cover. An
// attachment that names its pod is covered by that pod only; an address
// it holds is taken from any other pod of the node still reporting it (a
// deleted pod the informer has not dropped yet).
func (c *PolicyController) localPods(allocs []ipam.Allocation) ([]*corev1.Pod, covered) {
	byRef := map[string][]netip.Addr{} // a pod whose sandbox was replaced may hold two attachments for a while
	owner := map[netip.Addr]string{}
	for _, al := range allocs {
		if al.Pod == nil {
			continue
		}
		key := al.Pod.Namespace + "/" + al.Pod.Name
		if p := c.pods[key]; p != nil && p.Spec.NodeName == c.opts.NodeName && (al.Pod.UID == "" || al.Pod.UID == string(p.UID)) {
			byRef[key] = append(byRef[key], al.Addresses...)
			for _, a := range al.Addresses {
				owner[a] = key
			}
		}
	}
	pods := make([]*corev1.Pod, 0, len(c.pods))
	local := map[netip.Addr]string{} // address -> local pod reporting it, for attachments that name none
	for key, p := range c.pods {
		if p.Spec.NodeName != c.opts.NodeName || p.Spec.HostNetwork {
			pods = append(pods, p)
			continue
		}
		if addrs := byRef[key]; len(addrs) > 0 {
			p = withIPs(p, addrs)
		} else if ips := policy.PodIPs(p); slices.ContainsFunc(ips, func(a netip.Addr) bool { return owner[a] != "" }) {
			p = withIPs(p, slices.DeleteFunc(slices.Clone(ips), func(a netip.Addr) bool { return owner[a] != "" }))
		}
		pods = append(pods, p)
		for _, a := range policy.PodIPs(p) {
			local[a] = key
		}
	}
	cov := covered{}
	for _, al := range allocs {
		if len(al.Addresses) == 0 {
			continue
		}
		want := local[al.Addresses[0]]
		if al.Pod != nil && owner[al.Addresses[0]] != "" {
			want = owner[al.Addresses[0]]
		}
		if want != "" && !slices.ContainsFunc(al.Addresses, func(a netip.Addr) bool { return local[a] != want }) {
			cov[al.Key] = al.Addresses
		}
	}
	return pods, cov
}

// unselected are the attachments of cov whose pod no policy selects.
func unselected(cov covered, d policy.Desired) covered {
	selected := map[netip.Addr]bool{}
	for _, p := range d.Pods { // the isolated pods
		for _, a := range p.IPs {
			selected[a] = true
		}
	}
	out := covered{}
	for k, addrs := range cov {
		if !slices.ContainsFunc(addrs, func(a netip.Addr) bool { return selected[a] }) {
			out[k] = addrs
		}
	}
	return out
}

// withIPs is p with addrs as its addresses (a shallow copy: the compiler
// only reads).
func withIPs(p *corev1.Pod, addrs []netip.Addr) *corev1.Pod {
	cp := *p
	cp.Status.PodIPs, cp.Status.PodIP = nil, ""
	for _, a := range addrs {
		cp.Status.PodIPs = append(cp.Status.PodIPs, corev1.PodIP{IP: a.String()})
	}
	if len(addrs) > 0 {
		cp.Status.PodIP = addrs[0].String()
	}
	return &cp
}

// markReady puts the addresses of the attachments whose chains are applied
// (cov), or whose bound has passed, in the ready sets, and takes out
// addresses no attachment holds. It holds the IPAM lock (shared) while it
// reads the allocations and writes the sets: the plugin revokes an address
// it hands out anew under the same lock, so an address is never marked
// ready for a pod other than the one now holding it. seen is when the
// plugin's last save was noticed (zero: unknown).
func (c *PolicyController) markReady(cov covered, v6 bool, seen time.Time) error {
	store, err := allocationStore(c.opts.IPAMDataDir)
	if err != nil {
		return err
	}
	now := time.Now()
	if seen.IsZero() {
		seen = now
	}
	ps := &c.pending
	if ps.first == nil {
		ps.first, ps.fresh = map[ipam.Key]time.Time{}, map[ipam.Key]bool{}
	}
	return store.View(func(st *ipam.State) error {
		have, err := c.backend.readyMembers(v6)
		if err != nil {
			return err
		}
		allocated := map[netip.Addr]bool{}
		live := map[ipam.Key]bool{}
		var add []netip.Addr
		var waiting []time.Time
		for _, al := range st.Allocations {
			live[al.Key] = true
			for _, a := range al.Addresses {
				allocated[a] = true
			}
			if !slices.ContainsFunc(al.Addresses, func(a netip.Addr) bool { return !have[a] }) {
				delete(ps.first, al.Key) // ready (possibly by an earlier agent)
				delete(ps.fresh, al.Key)
				continue
			}
			first, ok := ps.first[al.Key]
			if !ok {
				first = seen
				ps.first[al.Key] = first
				ps.fresh[al.Key] = ps.started
			}
			switch {
			case slices.Equal(cov[al.Key], al.Addresses):
				if ps.fresh[al.Key] {
					c.metrics.pendingSeconds.Observe(now.Sub(first).Seconds())
				}
			case now.Sub(first) >= c.opts.PendingTimeout:
				c.metrics.pendingExpired.Inc()
				c.opts.Log.Warn("new pod attachment not tied to a Pod within the bound: released as a pod no policy selects",
					"container", al.ContainerID, "ifname", al.IfName, "pod", podRefString(al.Pod), "addresses", al.Addresses, "bound", c.opts.PendingTimeout)
			default:
				waiting = append(waiting, first)
				continue
			}
			add = append(add, al.Addresses...)
			delete(ps.first, al.Key)
			delete(ps.fresh, al.Key)
		}
		for k := range ps.first {
			if !live[k] {
				delete(ps.first, k)
				delete(ps.fresh, k)
			}
		}
		var del []netip.Addr
		for a := range have {
			if !allocated[a] {
				del = append(del, a)
			}
		}
		if err := c.backend.readyAdd(add); err != nil {
			return err
		}
		if err := c.backend.readyDel(del); err != nil {
			return err
		}
		ps.started = true
		ps.settled = ""
		if len(waiting) == 0 {
			ps.settled = fingerprint(st.Allocations)
		}
		c.metrics.pending.Set(float64(len(waiting)))
		c.armBound(waiting, now)
		return nil
	})
}

// armBound pokes the loop when the earliest of the waiting attachments
// reaches the bound.
func (c *PolicyController) armBound(waiting []time.Time, now time.Time) {
	if c.pending.timer != nil {
		c.pending.timer.Stop()
	}
	if len(waiting) == 0 {
		return
	}
	earliest := slices.MinFunc(waiting, func(a, b time.Time) int { return a.Compare(b) })
	c.pending.timer = time.AfterFunc(earliest.Add(c.opts.PendingTimeout).Sub(now), c.allocationsChanged)
}

func podRefString(r *ipam.PodRef) string {
	if r == nil {
		return ""
	}
	return fmt.Sprintf("%s/%s", r.Namespace, r.Name)
}

// bridgeHasIPv6 reports whether the pod bridge carries a global IPv6
// address (an IPv6 pod range's gateway).
func bridgeHasIPv6(name string) bool {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return false
	}
	addrs, err := netlink.AddrList(l, netlink.FAMILY_V6)
	if err != nil {
		return false
	}
	return slices.ContainsFunc(addrs, func(a netlink.Addr) bool { return a.IP.IsGlobalUnicast() })
}
