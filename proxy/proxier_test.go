package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weftnet/weft/proxy"
	"github.com/weftnet/weft/proxy/model"
)

// These tests run in synctest bubbles: the clock moves only when every
// goroutine is blocked, so a backend that "takes" 2 s takes exactly 2 s of
// the bubble's clock and the latencies below are exact, not measured.

// recBackend records the syncs it is asked for; each takes took, and the
// first fail ones fail.
type recBackend struct {
	mu    sync.Mutex
	took  time.Duration
	fail  int
	syncs []recSync
}

type recSync struct {
	ports, endpoints int
	full             bool
}

func (b *recBackend) Sync(st model.State, full bool) error {
	time.Sleep(b.took)
	n := 0
	for _, eps := range st.Endpoints {
		n += len(eps)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.syncs = append(b.syncs, recSync{len(st.Ports), n, full})
	if len(b.syncs) <= b.fail {
		return errors.New("injected failure")
	}
	return nil
}

func (b *recBackend) Cleanup() error { return nil }

func (b *recBackend) recorded() []recSync {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]recSync(nil), b.syncs...)
}

func service(i int) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("svc-%d", i)},
		Spec: corev1.ServiceSpec{ClusterIP: fmt.Sprintf("10.96.0.%d", i+1),
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}
}

// slice is service i's EndpointSlice with one ready endpoint; a non-empty
// trigger becomes its last-change-trigger-time annotation.
func slice(i int, ip, trigger string) *discoveryv1.EndpointSlice {
	name, proto, port, ready := "http", corev1.ProtocolTCP, int32(8080), true
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("svc-%d-1", i),
			Labels: map[string]string{discoveryv1.LabelServiceName: fmt.Sprintf("svc-%d", i)}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Protocol: &proto, Port: &port}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
	}
	if trigger != "" {
		es.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: trigger}
	}
	return es
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// run runs p in the bubble until the test ends.
func run(t *testing.T, p *proxy.Proxier) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// TestNoSyncBeforeInitialState: however long the sources take to deliver
// their initial state, nothing is programmed before OnSynced; then the
// first sync is a full one over all of it. (A restarted proxy that
// programmed a partial view would cut the Services it had not seen yet.)
func TestNoSyncBeforeInitialState(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &recBackend{}
		p := proxy.New(b, proxy.Options{Log: quiet()})
		run(t, p)
		const n = 20
		for i := range n {
			p.OnService(nil, service(i))
			time.Sleep(time.Second) // a slow initial list
			if i%2 == 0 {
				p.OnEndpointSlice(nil, slice(i, fmt.Sprintf("10.244.0.%d", i+1), ""))
			}
		}
		synctest.Wait()
		if got := b.recorded(); len(got) > 0 {
			t.Fatalf("synced before the initial state was complete: %+v", got)
		}
		for i := 1; i < n; i += 2 {
			p.OnEndpointSlice(nil, slice(i, fmt.Sprintf("10.244.0.%d", i+1), ""))
		}
		p.OnSynced()
		time.Sleep(time.Second)
		synctest.Wait()
		got := b.recorded()
		if want := (recSync{ports: n, endpoints: n, full: true}); len(got) != 1 || got[0] != want {
			t.Fatalf("syncs after OnSynced: %+v, want one: %+v", got, want)
		}
	})
}

// histogram returns the sample count and sum of a histogram in m.
func histogram(t *testing.T, m *proxy.Metrics, name string) (uint64, float64) {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0, 0
}

// TestNetworkProgrammingLatency: kubeproxy_network_programming_duration_seconds
// runs from each EndpointSlice change's last-change-trigger-time to the end
// of the sync that programmed it, as kube-proxy measures it: not for the
// state found at start-up, nor for slices without (or with an unparsable)
// annotation; a change whose sync failed is observed when the retry
// programs it. kubeproxy_sync_proxy_rules_duration_seconds is one sync
// round, failed ones included.
func TestNetworkProgrammingLatency(t *testing.T) {
	const programming = "kubeproxy_network_programming_duration_seconds"
	const rounds = "kubeproxy_sync_proxy_rules_duration_seconds"
	synctest.Test(t, func(t *testing.T) {
		b := &recBackend{took: 2 * time.Second}
		p := proxy.New(b, proxy.Options{Log: quiet(), MinSyncPeriod: time.Second})
		run(t, p)
		at := func(d time.Duration) string { return time.Now().Add(d).UTC().Format(time.RFC3339Nano) }

		// Start-up: the initial state's trigger times predate the proxier.
		p.OnService(nil, service(0))
		p.OnEndpointSlice(nil, slice(0, "10.244.0.1", at(-time.Hour)))
		p.OnSynced()
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if n, sum := histogram(t, p.Metrics(), rounds); n != 1 || sum != 2 {
			t.Errorf("%s after the first sync: %d rounds, %vs in all; want 1 round of 2s", rounds, n, sum)
		}
		if n, _ := histogram(t, p.Metrics(), programming); n != 0 {
			t.Errorf("%s observed %d changes from before the start", programming, n)
		}

		// The controller saw the Pod change 3 s before the slice reaches the
		// proxy; the sync starts at once and takes 2 s: 5 s.
		p.OnEndpointSlice(slice(0, "10.244.0.1", ""), slice(0, "10.244.0.2", at(-3*time.Second)))
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if n, sum := histogram(t, p.Metrics(), programming); n != 1 || sum != 5 {
			t.Errorf("%s: %d changes, %vs in all; want 1 change of 5s", programming, n, sum)
		}

		// Without annotation, or with a bad one: nothing observed.
		p.OnEndpointSlice(nil, slice(1, "10.244.0.3", ""))
		p.OnEndpointSlice(nil, slice(2, "10.244.0.4", "yesterday"))
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if n, _ := histogram(t, p.Metrics(), programming); n != 1 {
			t.Errorf("%s: %d changes, want still 1", programming, n)
		}

		// A failed sync programs nothing: the change is observed when the
		// retry (after the runner's back-off) has programmed it.
		b.mu.Lock()
		b.fail = len(b.syncs) + 1
		b.mu.Unlock()
		p.OnEndpointSlice(slice(0, "10.244.0.2", ""), slice(0, "10.244.0.5", at(0)))
		time.Sleep(time.Minute)
		synctest.Wait()
		syncs := b.recorded()
		n, sum := histogram(t, p.Metrics(), programming)
		// The failed round started at once, took 2 s, the retry came 1 s
		// later (back-off: the min sync period) and took 2 s: 5 s.
		if n != 2 || sum != 5+5 {
			t.Errorf("%s after a failed sync: %d changes, %vs in all; want 2, 10s (syncs %+v)", programming, n, sum, syncs)
		}
		if n, _ := histogram(t, p.Metrics(), rounds); int(n) != len(syncs) {
			t.Errorf("%s counted %d rounds, the backend saw %d", rounds, n, len(syncs))
		}
	})
}
