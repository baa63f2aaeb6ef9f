package main

import (
	"context"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	procstat "github.com/weftnet/weft/internal/proc"
	"github.com/weftnet/weft/lab"
	"github.com/weftnet/weft/test/bench/benchlab"
)

const (
	benchNS        = "proxybench"
	endpointPort   = 8080
	changedIPOctet = 255 // 10.244.255.x: only ever written by a change
)

func svcName(i int) string   { return fmt.Sprintf("svc-%05d", i) }
func sliceName(i int) string { return svcName(i) + "-bench" }

// peerNodes is how many nodes the seeded endpoints are spread over.
const peerNodes = 100

// seedIP is the j-th endpoint of service i, unique over all services: the
// first 62,500 endpoints 10.244.0-249.1-250 (the cluster CIDR), the next
// 62,500 10.101.0-249.1-250, then 10.102... (1M endpoints end in 10.116),
// never in 10.244.250-255.x, which -conn and the change phase use. Unique
// addresses, as pods have, so that a proxy that keys its backends by
// address holds as many as a real cluster makes it hold.
func seedIP(i, j, perSvc int) string {
	k := i*perSvc + j
	block, r := k/62500, k%62500
	second := byte(244)
	if block > 0 {
		second = byte(100 + block)
	}
	return netip.AddrFrom4([4]byte{10, second, byte(r / 250), byte(r%250 + 1)}).String()
}

// The bench gives its Services their ClusterIPs itself, from ServiceCIDR
// objects (networking.k8s.io/v1) of its own, 10.97.0.0/16 on, 65,000
// addresses each: the API server allocates a ClusterIP it chooses under one
// lock, one Service at a time, each allocation an API write (an IPAddress
// object) that waits for etcd; an address the client names is allocated
// (its IPAddress written) in parallel. The Services and what the proxies'
// informers see are the same either way. Three CIDRs, 10.97-99, stay clear
// of the lab's 10.96.0.0/16 and of the endpoints (10.101 on).
const (
	benchCIDRSize  = 65000
	benchCIDRFirst = 97
	benchCIDRs     = 3
	benchCIDRName  = "proxybench-%d"
)

// benchClusterIP is service i's ClusterIP: 10.97.0.1 on, never a
// CIDR's first or last address.
func benchClusterIP(i int) string {
	k, r := i/benchCIDRSize, i%benchCIDRSize+1
	return netip.AddrFrom4([4]byte{10, byte(benchCIDRFirst + k), byte(r / 256), byte(r % 256)}).String()
}

// ensureServiceCIDRs creates the ServiceCIDRs that n Services need and
// waits until the API server allocates from them.
func ensureServiceCIDRs(ctx context.Context, c kubernetes.Interface, n int) error {
	if n > benchCIDRs*benchCIDRSize {
		return fmt.Errorf("%d Services: the bench has ClusterIPs for %d", n, benchCIDRs*benchCIDRSize)
	}
	for k := 0; k*benchCIDRSize < n; k++ {
		name := fmt.Sprintf(benchCIDRName, k+1)
		cidr := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{fmt.Sprintf("10.%d.0.0/16", benchCIDRFirst+k)}}}
		if _, err := c.NetworkingV1().ServiceCIDRs().Create(ctx, cidr, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("adding ServiceCIDR %s: %w", cidr.Spec.CIDRs[0], err)
		}
		for ready := false; !ready; {
			got, err := c.NetworkingV1().ServiceCIDRs().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			ready = apimeta.IsStatusConditionTrue(got.Status.Conditions, networkingv1.ServiceCIDRConditionReady)
			if !ready {
				if err := sleep(ctx, 200*time.Millisecond); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// seeder creates the bench's Services and EndpointSlices through the API
// server, with a protobuf client without client-side rate limit
// (benchlab.Lab.SeedClient), workers at a time, and remembers each
// Service's ClusterIP (vips[i]) for the from-scratch check.
type seeder struct {
	c       kubernetes.Interface
	workers int
	labDir  string
	// dynamic: the API server chooses the ClusterIPs (for comparison).
	dynamic bool
	vips    []string
}

// seedStats is what one seeding took: its duration, and the CPU time
// (seconds) of the control-plane processes and of the bench itself.
type seedStats struct {
	n      int
	dur    time.Duration
	cpu    map[string]float64
	etcdDB int64 // bytes in etcd's data directory afterwards
}

func (st seedStats) String() string {
	s := fmt.Sprintf("%d Services + EndpointSlices in %.1fs (%.0f Services/s)", st.n, st.dur.Seconds(), float64(st.n)/st.dur.Seconds())
	return s + fmt.Sprintf("; CPU %s; etcd data %.0f MiB", cpuShares(st.cpu, st.dur), float64(st.etcdDB)/(1<<20))
}

// dirSize is the bytes of the files under dir.
func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// seedProcs are the processes whose CPU time the seeding reports.
var seedProcs = []string{"kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler"}

// cpuShares formats CPU seconds as cores over d.
func cpuShares(cpu map[string]float64, d time.Duration) string {
	var parts []string
	for _, n := range append(slices.Clone(seedProcs), "bench") {
		if v, ok := cpu[n]; ok {
			parts = append(parts, fmt.Sprintf("%s %.2f", strings.TrimPrefix(n, "kube-"), v/d.Seconds()))
		}
	}
	return strings.Join(parts, ", ") + " cores"
}

// cpuTimes reads the CPU seconds (user + system) of the lab's seedProcs
// and of this process.
func (s *seeder) cpuTimes() map[string]float64 {
	out := map[string]float64{}
	read := func(name string, pid int) {
		if d, err := procstat.CPU(pid); err == nil {
			out[name] = d.Seconds()
		}
	}
	for _, n := range seedProcs {
		if pid, ok := lab.PID(s.labDir, n); ok {
			read(n, pid)
		}
	}
	read("bench", os.Getpid())
	return out
}

func cpuDelta(a, b map[string]float64) map[string]float64 {
	d := map[string]float64{}
	for k, v := range b {
		if v0, ok := a[k]; ok {
			d[k] = v - v0
		}
	}
	return d
}

// seed creates Services [from, to), each a selector-less ClusterIP Service
// (so the EndpointSlice controller leaves it alone) with a hand-made
// EndpointSlice of perSvc ready endpoints. No proxy runs meanwhile: each
// is started after the seeding, for its measurement, and stopped after it.
// Every 30 s it prints its progress and where the CPU went.
func (s *seeder) seed(ctx context.Context, from, to, perSvc int) (seedStats, error) {
	if err := benchlab.EnsureNamespace(ctx, s.c, benchNS); err != nil {
		return seedStats{}, err
	}
	if !s.dynamic {
		if err := ensureServiceCIDRs(ctx, s.c, to); err != nil {
			return seedStats{}, err
		}
	}
	if len(s.vips) < to {
		s.vips = append(s.vips, make([]string, to-len(s.vips))...)
	}
	start, cpu0 := time.Now(), s.cpuTimes()
	var done atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		last, lastN, lastCPU := start, int64(0), cpu0
		for {
			select {
			case <-stop:
				return
			case <-time.After(30 * time.Second):
			}
			now, n, cpu := time.Now(), done.Load(), s.cpuTimes()
			fmt.Printf("   seeding: %d of %d, %.0f Services/s in the last %.0fs; CPU %s\n", n, to-from,
				float64(n-lastN)/now.Sub(last).Seconds(), now.Sub(last).Seconds(), cpuShares(cpuDelta(lastCPU, cpu), now.Sub(last)))
			last, lastN, lastCPU = now, n, cpu
		}
	})
	err := benchlab.ParallelN(ctx, s.workers, from, to, func(i int) error {
		if err := s.seedOne(ctx, i, perSvc); err != nil {
			return fmt.Errorf("seeding %s: %w", svcName(i), err)
		}
		done.Add(1)
		return nil
	})
	close(stop)
	wg.Wait()
	return seedStats{n: to - from, dur: time.Since(start), cpu: cpuDelta(cpu0, s.cpuTimes()), etcdDB: dirSize(filepath.Join(s.labDir, "etcd"))}, err
}

func (s *seeder) seedOne(ctx context.Context, i, perSvc int) error {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: svcName(i)},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Ports: []corev1.ServicePort{{
			Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(endpointPort),
		}}},
	}
	if !s.dynamic {
		svc.Spec.ClusterIP = benchClusterIP(i)
	}
	created, err := s.c.CoreV1().Services(benchNS).Create(ctx, svc, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		created, err = s.c.CoreV1().Services(benchNS).Get(ctx, svcName(i), metav1.GetOptions{})
	}
	if err != nil {
		return err
	}
	s.vips[i] = created.Spec.ClusterIP
	ready, name, proto, port := true, "http", corev1.ProtocolTCP, int32(endpointPort)
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: sliceName(i), Labels: map[string]string{
			discoveryv1.LabelServiceName: svcName(i),
			discoveryv1.LabelManagedBy:   "proxybench.weft.dev",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Protocol: &proto, Port: &port}},
	}
	for j := 0; j < perSvc; j++ {
		// As the EndpointSlice controller writes them: every endpoint names
		// its node (pods spread over other nodes than the measured one).
		node := fmt.Sprintf("peer-%d", (i*perSvc+j)%peerNodes)
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{seedIP(i, j, perSvc)},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			NodeName:   &node,
		})
	}
	_, err = s.c.DiscoveryV1().EndpointSlices(benchNS).Create(ctx, slice, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// changeOne gives the first endpoint of service i's slice the address ip,
// with the time of the change in endpoints.kubernetes.io/last-change-trigger-time
// as the EndpointSlice controller writes it (the proxies measure their
// network programming latency from it). It reads the slice first and calls
// before() just before the update, so the measured time starts at the write.
func changeOne(ctx context.Context, c kubernetes.Interface, i int, ip string, before func()) error {
	s, err := c.DiscoveryV1().EndpointSlices(benchNS).Get(ctx, sliceName(i), metav1.GetOptions{})
	if err != nil {
		return err
	}
	s.Endpoints[0].Addresses = []string{ip}
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[corev1.EndpointsLastChangeTriggerTime] = time.Now().UTC().Format(time.RFC3339Nano)
	before()
	_, err = c.DiscoveryV1().EndpointSlices(benchNS).Update(ctx, s, metav1.UpdateOptions{})
	return err
}
