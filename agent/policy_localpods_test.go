package agent

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/weftnet/weft/ipam"
	"github.com/weftnet/weft/policy"
)

// The compiler sees a new pod with its attachment's addresses as soon as
// the attachment names it; an attachment is covered only by its own pod.
func TestLocalPods(t *testing.T) {
	c, err := NewPolicyController(PolicyOptions{NodeName: pendNode})
	if err != nil {
		t.Fatal(err)
	}
	a := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	withStatus := func(p *corev1.Pod, ips ...string) *corev1.Pod {
		p.Status.Phase = corev1.PodRunning
		for _, ip := range ips {
			p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
		}
		return p
	}
	fresh := pendPod("x", "fresh", nil)                                 // named by its attachment, no address in the API yet
	reported := withStatus(pendPod("x", "reported", nil), "10.244.1.3") // known from the API only
	stale := withStatus(pendPod("x", "stale", nil), "10.244.1.4")       // deleted, still in the informer: its address is reused
	reused := pendPod("x", "reused", nil)
	other := pendPod("x", "other-incarnation", nil)
	remote := pendPod("y", "remote", nil)
	remote.Spec.NodeName = "node2"
	for _, p := range []*corev1.Pod{fresh, reported, stale, reused, other, remote} {
		c.OnPolicyPod(nil, p)
	}
	ref := func(p *corev1.Pod) *ipam.PodRef {
		return &ipam.PodRef{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID)}
	}
	wrongUID := ref(other)
	wrongUID.UID = "uid-of-an-earlier-pod"
	allocs := []ipam.Allocation{
		{Key: ipam.Key{ContainerID: "fresh", IfName: "eth0"}, Addresses: []netip.Addr{a("10.244.1.2"), a("fd00::2")}, Pod: ref(fresh)},
		{Key: ipam.Key{ContainerID: "reported", IfName: "eth0"}, Addresses: []netip.Addr{a("10.244.1.3")}},
		{Key: ipam.Key{ContainerID: "reused", IfName: "eth0"}, Addresses: []netip.Addr{a("10.244.1.4")}, Pod: ref(reused)},
		{Key: ipam.Key{ContainerID: "other", IfName: "eth0"}, Addresses: []netip.Addr{a("10.244.1.5")}, Pod: wrongUID},
		{Key: ipam.Key{ContainerID: "remote", IfName: "eth0"}, Addresses: []netip.Addr{a("10.244.1.6")}, Pod: ref(remote)},
		{Key: ipam.Key{ContainerID: "nobody", IfName: "eth0"}, Addresses: []netip.Addr{a("10.244.1.7")}},
	}
	c.mu.Lock()
	pods, cov := c.localPods(allocs)
	c.mu.Unlock()
	ips := map[string][]netip.Addr{}
	for _, p := range pods {
		ips[p.Name] = policy.PodIPs(p)
	}
	for name, want := range map[string][]netip.Addr{
		"fresh": {a("10.244.1.2"), a("fd00::2")}, "reported": {a("10.244.1.3")}, "stale": nil, "reused": {a("10.244.1.4")},
		"other-incarnation": nil, "remote": nil,
	} {
		if !slices.Equal(ips[name], want) {
			t.Errorf("pod %s compiled with %v, want %v", name, ips[name], want)
		}
	}
	var got []string
	for k := range cov {
		got = append(got, k.ContainerID)
	}
	slices.Sort(got)
	if want := []string{"fresh", "reported", "reused"}; !slices.Equal(got, want) {
		t.Errorf("covered attachments %v, want %v", got, want)
	}
	if fresh.Status.PodIPs != nil || len(stale.Status.PodIPs) != 1 {
		t.Error("localPods changed the informer's objects")
	}
}
