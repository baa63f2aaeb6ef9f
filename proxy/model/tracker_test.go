package model

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// snap takes a snapshot, checks it against Build over objs, and returns
// the changed port names, sorted.
func snap(t *testing.T, tr *Tracker, svcs []*corev1.Service, es []*discoveryv1.EndpointSlice) []string {
	t.Helper()
	st, changed, errs := tr.Snapshot()
	want, wantErrs := Build(svcs, es)
	if !reflect.DeepEqual(st, want) {
		t.Errorf("snapshot state differs from Build:\n%+v\n%+v", st, want)
	}
	if !reflect.DeepEqual(errs, wantErrs) {
		t.Errorf("snapshot errors %v, Build's %v", errs, wantErrs)
	}
	var out []string
	for n, ok := range changed {
		if ok {
			out = append(out, n.String())
		}
	}
	slices.Sort(out)
	return out
}

func expect(t *testing.T, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("changed = %v, want %v", got, want)
	}
}

func TestTrackerCoalescing(t *testing.T) {
	tr := NewTracker()
	web := svc("default", "web")
	es1 := slice("default", "web-1", "web", v4, eports(eport("http", 8080)), ep("10.244.0.1"))
	expect(t, snap(t, tr, nil, nil))

	tr.OnService(nil, web)
	tr.OnEndpointSlice(nil, es1)
	expect(t, snap(t, tr, svcs(web), slices1(es1)), "default/web:http/TCP")
	expect(t, snap(t, tr, svcs(web), slices1(es1))) // nothing happened

	// Several updates coalesce into one change.
	es2 := slice("default", "web-1", "web", v4, eports(eport("http", 8080)), ep("10.244.0.1"), ep("10.244.0.2"))
	es3 := slice("default", "web-1", "web", v4, eports(eport("http", 8080)), ep("10.244.0.2"))
	tr.OnEndpointSlice(es1, es2)
	tr.OnEndpointSlice(es2, es3)
	expect(t, snap(t, tr, svcs(web), slices1(es3)), "default/web:http/TCP")

	// Changes that cancel out report nothing.
	tr.OnEndpointSlice(es3, es1)
	tr.OnEndpointSlice(es1, es3)
	tr.OnService(web, nil)
	tr.OnService(nil, web)
	expect(t, snap(t, tr, svcs(web), slices1(es3)))

	// A new port, and a removed one.
	web2 := svc("default", "web", withPorts(corev1.ServicePort{Name: "https", Port: 443}))
	tr.OnService(web, web2)
	expect(t, snap(t, tr, svcs(web2), slices1(es3)), "default/web:http/TCP", "default/web:https/TCP")

	// Delete all.
	tr.OnService(web2, nil)
	tr.OnEndpointSlice(es3, nil)
	expect(t, snap(t, tr, nil, nil), "default/web:https/TCP")
}

// TestTrackerNoOpUpdate: an update that changes nothing built (a new
// resourceVersion, a label, a port name no Service uses) reports nothing.
func TestTrackerNoOpUpdate(t *testing.T) {
	tr := NewTracker()
	web := svc("default", "web")
	es := slice("default", "web-1", "web", v4, eports(eport("http", 8080)), ep("10.244.0.1"))
	tr.OnService(nil, web)
	tr.OnEndpointSlice(nil, es)
	snap(t, tr, svcs(web), slices1(es))

	web2 := web.DeepCopy()
	web2.ResourceVersion, web2.Labels = "2", map[string]string{"x": "y"}
	es2 := es.DeepCopy()
	es2.ResourceVersion = "2"
	es2.Ports = append(es2.Ports, eport("unused", 1))
	tr.OnService(web, web2)
	tr.OnEndpointSlice(es, es2)
	expect(t, snap(t, tr, svcs(web2), slices1(es2)))
}

func TestTrackerSliceMoved(t *testing.T) {
	tr := NewTracker()
	a, b := svc("default", "a"), svc("default", "b", withIPs("10.96.0.11"))
	es := slice("default", "s", "a", v4, eports(eport("http", 8080)), ep("10.244.0.1"))
	tr.OnService(nil, a)
	tr.OnService(nil, b)
	tr.OnEndpointSlice(nil, es)
	expect(t, snap(t, tr, svcs(a, b), slices1(es)), "default/a:http/TCP", "default/b:http/TCP")

	moved := es.DeepCopy()
	moved.Labels[discoveryv1.LabelServiceName] = "b"
	tr.OnEndpointSlice(es, moved)
	expect(t, snap(t, tr, svcs(a, b), slices1(moved)), "default/a:http/TCP", "default/b:http/TCP")
	st, _, _ := tr.Snapshot()
	if len(st.Endpoints[spn("default", "a", "http", TCP)]) != 0 || len(st.Endpoints[spn("default", "b", "http", TCP)]) != 1 {
		t.Errorf("endpoints = %v", st.Endpoints)
	}

	// Relabelled to nothing: b loses it, and the slice is reported.
	lost := moved.DeepCopy()
	delete(lost.Labels, discoveryv1.LabelServiceName)
	tr.OnEndpointSlice(moved, lost)
	expect(t, snap(t, tr, svcs(a, b), slices1(lost)), "default/b:http/TCP")
}

// TestTrackerErrors: errors follow the objects, and an early slice finds
// its Service when it comes.
func TestTrackerErrors(t *testing.T) {
	tr := NewTracker()
	es := slice("default", "web-1", "web", v4, eports(eport("http", 8080)), ep("10.244.0.1"))
	tr.OnEndpointSlice(nil, es)
	expect(t, snap(t, tr, nil, slices1(es)))

	web := svc("default", "web")
	bad := svc("default", "bad", withIPs("nope"))
	tr.OnService(nil, web)
	tr.OnService(nil, bad)
	expect(t, snap(t, tr, svcs(web, bad), slices1(es)), "default/web:http/TCP")

	good := svc("default", "bad", withIPs("10.96.0.99"))
	tr.OnService(bad, good)
	expect(t, snap(t, tr, svcs(web, good), slices1(es)), "default/bad:http/TCP")
}

// TestTrackerSnapshotsStable: a State handed out is not changed by later
// events or snapshots.
func TestTrackerSnapshotsStable(t *testing.T) {
	tr := NewTracker()
	web := svc("default", "web")
	tr.OnService(nil, web)
	st1, _, _ := tr.Snapshot()
	ports1 := maps.Clone(st1.Ports)
	tr.OnService(web, nil)
	tr.OnService(nil, svc("default", "api"))
	tr.Snapshot()
	if !maps.Equal(st1.Ports, ports1) {
		t.Error("a later snapshot changed an earlier State")
	}
}

// TestTrackerConcurrent runs informer-like writers against a sync loop;
// run with -race.
func TestTrackerConcurrent(t *testing.T) {
	tr := NewTracker()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				name := fmt.Sprintf("s%d-%d", w, i%10)
				s := svc("default", name, withIPs(fmt.Sprintf("10.96.%d.%d", w, i%10)))
				es := slice("default", name+"-1", name, v4, eports(eport("http", 8080)), ep(fmt.Sprintf("10.244.%d.%d", w, i)))
				tr.OnService(nil, s)
				tr.OnEndpointSlice(nil, es)
				if i%3 == 0 {
					tr.OnService(s, nil)
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 100 {
			tr.Snapshot()
		}
	}()
	wg.Wait()
	<-done
	st, _, _ := tr.Snapshot()
	tr.mu.Lock()
	var allSvcs []*corev1.Service
	var allSlices []*discoveryv1.EndpointSlice
	for _, s := range tr.x.services {
		allSvcs = append(allSvcs, s)
	}
	for k := range tr.x.slices {
		allSlices = append(allSlices, tr.x.slicesOf(k)...)
	}
	tr.mu.Unlock()
	if want, _ := Build(allSvcs, allSlices); !reflect.DeepEqual(st, want) {
		t.Error("final snapshot differs from Build over the final objects")
	}
}

func svcs(s ...*corev1.Service) []*corev1.Service { return s }

func slices1(es ...*discoveryv1.EndpointSlice) []*discoveryv1.EndpointSlice { return es }
