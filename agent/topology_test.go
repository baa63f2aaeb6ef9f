package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/internal/testutil"
	"github.com/weftnet/weft/ipam"
	"github.com/weftnet/weft/routing"
	"github.com/weftnet/weft/topology"
)

// exporterBed is an exporter on a fake API server and a real IPAM state
// directory, for a node whose /29 podCIDR holds 5 pods.
type exporterBed struct {
	client *fake.Clientset
	store  *ipam.DiskStore
	pool   *ipam.Pool
	exp    *TopologyExporter
}

const bedPodIPs = 5

func newExporterBed(t testing.TB) *exporterBed {
	t.Helper()
	if !netnsutil.Isolated() {
		t.Skip("the exporter applies traffic shaping: needs root to run in a private network namespace")
	}
	cidr := netip.MustParsePrefix("10.244.1.0/29")
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node1", UID: "node1-uid"},
		Spec:       corev1.NodeSpec{PodCIDR: cidr.String(), PodCIDRs: []string{cidr.String()}},
		Status: corev1.NodeStatus{
			Capacity:    corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110")},
			Allocatable: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110")},
			Addresses:   []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "172.18.0.11"}},
		},
	}
	dir := t.TempDir()
	store, err := allocationStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := ipam.NewPool([]ipam.RangeSet{{{Subnet: cidr}}})
	if err != nil {
		t.Fatal(err)
	}
	b := &exporterBed{client: fake.NewClientset(node), store: store, pool: pool}
	b.exp = NewTopologyExporter(b.client, TopologyOptions{NodeName: "node1", Routing: routing.ModeHostGW, IPAMDataDir: dir,
		Resync: time.Hour, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.exp.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("exporter: %v", err)
		}
	})
	testutil.Eventually(t, 10*time.Second, "weft.dev/pod-ips published", func() bool {
		q := b.node(t).Status.Allocatable[topology.PodIPsResource]
		return q.Value() == bedPodIPs
	})
	return b
}

func (b *exporterBed) node(t testing.TB) *corev1.Node {
	t.Helper()
	n, err := b.client.CoreV1().Nodes().Get(context.Background(), "node1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// attach and detach are the CNI plugin's ADD and DEL of pod i's address.
func (b *exporterBed) attach(t testing.TB, i int) {
	t.Helper()
	if err := b.store.Update(func(st *ipam.State) error {
		_, err := b.pool.Allocate(st, ipam.Key{ContainerID: fmt.Sprintf("c%d", i), IfName: "eth0"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

func (b *exporterBed) detach(t testing.TB, i int) {
	t.Helper()
	if err := b.store.Update(func(st *ipam.State) error {
		b.pool.Release(st, ipam.Key{ContainerID: fmt.Sprintf("c%d", i), IfName: "eth0"})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// The taint follows the IPAM state (and the pods bound to the node that
// wait for an address); the kubelet's own resources are left alone; the
// maxPods warning is recorded once.
func TestExporterTaintFollowsAddresses(t *testing.T) {
	b := newExporterBed(t)
	tainted := func() bool { return topology.Tainted(b.node(t)) }
	for i := range bedPodIPs - 1 {
		b.attach(t, i)
	}
	// A pod bound to the node without its address yet claims the last one.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "waiting"}, Spec: corev1.PodSpec{NodeName: "node1"}}
	if _, err := b.client.CoreV1().Pods("x").Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the taint once a bound pod claims the last address", tainted)
	if err := b.client.CoreV1().Pods("x").Delete(context.Background(), "waiting", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the taint lifted when that pod went", func() bool { return !tainted() })

	b.attach(t, bedPodIPs-1)
	testutil.Eventually(t, 10*time.Second, "the taint with every address allocated", tainted)
	b.detach(t, 2)
	testutil.Eventually(t, 10*time.Second, "the taint lifted when an address was freed", func() bool { return !tainted() })

	n := b.node(t)
	if q := n.Status.Capacity[corev1.ResourcePods]; q.Value() != 110 {
		t.Fatalf("the kubelet's pods capacity became %s", q.String())
	}
	evs, err := b.client.CoreV1().Events("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	warned := 0
	for _, ev := range evs.Items {
		if ev.Reason == "PodCIDRSmallerThanMaxPods" && ev.Type == corev1.EventTypeWarning && ev.InvolvedObject.Name == "node1" {
			warned++
		}
	}
	if warned != 1 {
		t.Fatalf("%d maxPods warnings, want 1 (of %d events)", warned, len(evs.Items))
	}
}
