package proxytest

import (
	"fmt"
	"net/netip"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/weftnet/weft/proxy/model"
)

// BenchObjects are the backends' benchmark cluster: n ClusterIP Services
// made by Service (ports http and echo, in SvcCIDR), each with one slice of
// ten ready endpoints on other nodes (peer-0 to peer-99).
func BenchObjects(n int) ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
	svcs := make([]*corev1.Service, n)
	sl := make([]*discoveryv1.EndpointSlice, n)
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		svcs[i] = Service(name, addrAt(10<<24|96<<16, uint32(i/250)<<8|uint32(i%250+1)).String(), nil)
		var eps []Endpoint
		for j := range 10 {
			k := i*10 + j
			eps = append(eps, Endpoint{IP: addrAt(10<<24|244<<16, uint32(k)).String(), Node: fmt.Sprintf("peer-%d", k%100)})
		}
		sl[i] = Slice(name, eps...)
	}
	return svcs, sl
}

// BenchTracker is a tracker fed with svcs and sl, as informers feed the
// proxier's.
func BenchTracker(svcs []*corev1.Service, sl []*discoveryv1.EndpointSlice) *model.Tracker {
	tr := model.NewTracker()
	for _, s := range svcs {
		tr.OnService(nil, s)
	}
	for _, es := range sl {
		tr.OnEndpointSlice(nil, es)
	}
	return tr
}

// MoveEndpoint replaces sl[0] by a copy whose first endpoint has another
// address (the i-th of 10.245.0.0/16), through the tracker: one endpoint
// change of one Service.
func MoveEndpoint(tr *model.Tracker, sl []*discoveryv1.EndpointSlice, i int) {
	old := sl[0]
	moved := old.DeepCopy()
	moved.Endpoints[0].Addresses = []string{fmt.Sprintf("10.245.%d.%d", i/250%250, i%250+1)}
	tr.OnEndpointSlice(old, moved)
	sl[0] = moved
}

// CPUClock reports, per op, the CPU time of the benchmark's process
// (self-cpu-ms) and of the child processes it waited for: on a shared
// machine wall time is noisy, CPU time much less so.
type CPUClock struct{ self, children time.Duration }

// StartCPU starts a CPUClock.
func StartCPU(b *testing.B) CPUClock {
	var self, children syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &self); err != nil {
		b.Fatal(err)
	}
	if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &children); err != nil {
		b.Fatal(err)
	}
	cpu := func(r syscall.Rusage) time.Duration {
		return time.Duration(r.Utime.Nano() + r.Stime.Nano())
	}
	return CPUClock{cpu(self), cpu(children)}
}

// Report reports the CPU time since StartCPU per op: the process's as
// self-cpu-ms/op, the children's under the unit children ("": not
// reported).
func (c CPUClock) Report(b *testing.B, children string) {
	now := StartCPU(b)
	n := float64(b.N)
	b.ReportMetric(float64(now.self-c.self)/float64(time.Millisecond)/n, "self-cpu-ms/op")
	if children != "" {
		b.ReportMetric(float64(now.children-c.children)/float64(time.Millisecond)/n, children)
	}
}

// addrAt is the IPv4 address base+off (10.96.0.0 + 256 = 10.96.1.0): past
// 64k Services or endpoints the addresses go on in the next /16.
func addrAt(base, off uint32) netip.Addr {
	a := base + off
	return netip.AddrFrom4([4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), byte(a)})
}
