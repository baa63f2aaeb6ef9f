package model

import (
	"fmt"
	"maps"
	"reflect"
	"runtime"
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
	st, errs := tr.Snapshot()
	want, wantErrs := Build(svcs, es)
	if !sameState(st, want) {
		t.Errorf("snapshot state differs from Build:\n%+v\n%+v", st, want)
	}
	if !reflect.DeepEqual(errs, wantErrs) {
		t.Errorf("snapshot errors %v, Build's %v", errs, wantErrs)
	}
	var out []string
	for n := range st.Delta.Changed {
		out = append(out, n.String())
	}
	slices.Sort(out)
	return out
}

// sameState compares the ports and endpoints of two States.
func sameState(a, b State) bool {
	return reflect.DeepEqual(a.Ports, b.Ports) && reflect.DeepEqual(a.Endpoints, b.Endpoints)
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
	st, _ := tr.Snapshot()
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

// TestTrackerSnapshotsStable: a State handed out is not changed by events
// before the next Snapshot, and the next Snapshot's Delta holds what it had
// for every port that changed; ports that did not change keep their
// objects (consumers find them unchanged by identity).
func TestTrackerSnapshotsStable(t *testing.T) {
	tr := NewTracker()
	web, db := svc("default", "web"), svc("default", "db", withIPs("10.96.0.11"))
	es := slice("default", "db-1", "db", v4, eports(eport("http", 8080)), ep("10.244.0.1"))
	tr.OnService(nil, web)
	tr.OnService(nil, db)
	tr.OnEndpointSlice(nil, es)
	st1, _ := tr.Snapshot()
	ports1, eps1 := maps.Clone(st1.Ports), maps.Clone(st1.Endpoints)
	tr.OnService(web, nil)
	tr.OnService(nil, svc("default", "api", withIPs("10.96.0.12")))
	tr.OnEndpointSlice(es, slice("default", "db-1", "db", v4, eports(eport("http", 8080)), ep("10.244.0.2")))
	if !maps.Equal(st1.Ports, ports1) {
		t.Error("events changed a State before the next Snapshot")
	}
	st2, _ := tr.Snapshot()
	if st2.Delta.From != st1.Delta.To || st2.Delta.To == st1.Delta.To {
		t.Errorf("versions: first %+v, second %+v", st1.Delta, st2.Delta)
	}
	webN, dbN, apiN := spn("default", "web", "http", TCP), spn("default", "db", "http", TCP), spn("default", "api", "http", TCP)
	for name, p := range st2.Delta.Changed {
		if p.Port != ports1[name] || !sameList(p.Endpoints, eps1[name]) {
			t.Errorf("%s: prior %+v, the first snapshot had %+v and %v", name, p, ports1[name], eps1[name])
		}
	}
	if got := len(st2.Delta.Changed); got != 3 || st2.Delta.Changed[apiN].Port != nil {
		t.Errorf("changed %v, want web, db and api (new)", st2.Delta.Changed)
	}
	if st2.Ports[dbN] != ports1[dbN] {
		t.Error("db's ServicePort did not change but was replaced")
	}
	if _, ok := st2.Ports[webN]; ok {
		t.Error("web is still there")
	}
	st3, _ := tr.Snapshot()
	if len(st3.Delta.Changed) != 0 || st3.Delta.From != st2.Delta.To || st3.Delta.To != st2.Delta.To {
		t.Errorf("a snapshot with no event: %+v", st3.Delta)
	}
}

func sameList(a, b []Endpoint) bool { return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0]) }

// TestTrackerSnapshotCostsTheChange: a snapshot after one slice changed
// allocates as much with 4,000 Services as with 500 (it used to clone the
// State's maps: eight times as much).
func TestTrackerSnapshotCostsTheChange(t *testing.T) {
	alloc := func(n int) uint64 {
		svcs, es := benchObjects(n)
		tr := NewTracker()
		for i := range svcs {
			tr.OnService(nil, svcs[i])
			tr.OnEndpointSlice(nil, es[i])
		}
		tr.Snapshot()
		var total uint64
		cur := es[0]
		for i := range 20 {
			next := es[0].DeepCopy()
			next.Endpoints = next.Endpoints[:9+i%2]
			tr.OnEndpointSlice(cur, next)
			cur = next
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			st, _ := tr.Snapshot()
			runtime.ReadMemStats(&after)
			if len(st.Delta.Changed) != 1 {
				t.Fatalf("%d changes, want 1", len(st.Delta.Changed))
			}
			total += after.TotalAlloc - before.TotalAlloc
		}
		return total
	}
	small, large := alloc(500), alloc(4000)
	if large > 2*small {
		t.Errorf("one change allocates %d bytes at 4,000 Services, %d at 500", large, small)
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
	st, _ := tr.Snapshot()
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
	if want, _ := Build(allSvcs, allSlices); !sameState(st, want) {
		t.Error("final snapshot differs from Build over the final objects")
	}
}

func svcs(s ...*corev1.Service) []*corev1.Service { return s }

func slices1(es ...*discoveryv1.EndpointSlice) []*discoveryv1.EndpointSlice { return es }

// TestCursor: a consumer looks at a snapshot's Delta only when it consumed
// the snapshot before; a skipped snapshot, a State by hand or another
// tracker's snapshot make it compare everything.
func TestCursor(t *testing.T) {
	tr, other := NewTracker(), NewTracker()
	var c Cursor
	step := func(what string, st State, wantAll bool) {
		t.Helper()
		if _, all := c.Next(st); all != wantAll {
			t.Errorf("%s: all = %v, want %v", what, all, wantAll)
		}
	}
	st, _ := tr.Snapshot()
	step("the first snapshot (from the empty State)", st, false)
	st, _ = tr.Snapshot()
	step("the next one", st, false)
	tr.OnService(nil, svc("default", "web"))
	tr.Snapshot()
	tr.OnService(nil, svc("default", "api", withIPs("10.96.0.12")))
	st, _ = tr.Snapshot()
	step("after a skipped snapshot", st, true)
	step("a State by hand", State{Ports: st.Ports, Endpoints: st.Endpoints}, true)
	st, _ = tr.Snapshot()
	step("a snapshot after a State by hand", st, true)
	ost, _ := other.Snapshot()
	step("another tracker's first snapshot", ost, true)
	st, _ = tr.Snapshot()
	step("back to the first tracker", st, true)
	st, _ = tr.Snapshot()
	step("and its next snapshot", st, false)
}

// TestTrackerBigSnapshot: a first Snapshot of thousands of Services, built
// on every CPU, equals Build, errors included, and so does the next one
// after a few changes.
func TestTrackerBigSnapshot(t *testing.T) {
	tr := NewTracker()
	var ss []*corev1.Service
	var es []*discoveryv1.EndpointSlice
	for i := range 3000 {
		name := fmt.Sprintf("s%d", i)
		if i%500 != 7 { // a few slices without their Service
			ss = append(ss, svc("default", name, withIPs(fmt.Sprintf("10.96.%d.%d", i/250, i%250+1))))
		}
		es = append(es, slice("default", name+"-1", name, v4, eports(eport("http", 8080)),
			ep(fmt.Sprintf("10.244.%d.%d", i/250, i%250+1)), ep(fmt.Sprintf("10.245.%d.%d", i/250, i%250+1))))
	}
	for _, s := range ss {
		tr.OnService(nil, s)
	}
	for _, e := range es {
		tr.OnEndpointSlice(nil, e)
	}
	if got := snap(t, tr, ss, es); len(got) != len(ss) {
		t.Fatalf("first snapshot changed %d ports, want %d", len(got), len(ss))
	}
	moved := slice("default", "s1-1", "s1", v4, eports(eport("http", 8080)), ep("10.246.0.1"))
	tr.OnEndpointSlice(es[1], moved)
	es[1] = moved
	tr.OnService(ss[2], nil)
	ss = slices.Delete(ss, 2, 3)
	expect(t, snap(t, tr, ss, es), "default/s1:http/TCP", "default/s2:http/TCP")
}

// TestTrackerNotProxiedSlice: a slice labelled headless (or for another
// proxy) is as if it were not there, as kube-proxy never lists it; the
// label removed, its endpoints come back.
func TestTrackerNotProxiedSlice(t *testing.T) {
	for _, label := range []string{LabelHeadless, LabelServiceProxyName} {
		t.Run(label, func(t *testing.T) {
			tr := NewTracker()
			a := svc("default", "a")
			es := slice("default", "s", "a", v4, eports(eport("http", 8080)), ep("10.244.0.1"))
			tr.OnService(nil, a)
			tr.OnEndpointSlice(nil, es)
			expect(t, snap(t, tr, svcs(a), slices1(es)), "default/a:http/TCP")
			endpoints := func() int {
				st, _ := tr.Snapshot()
				return len(st.Endpoints[spn("default", "a", "http", TCP)])
			}
			if n := endpoints(); n != 1 {
				t.Fatalf("%d endpoints before the label, want 1", n)
			}

			labelled := es.DeepCopy()
			labelled.Labels[label] = "other"
			tr.OnEndpointSlice(es, labelled)
			expect(t, snap(t, tr, svcs(a), slices1(labelled)), "default/a:http/TCP")
			if n := endpoints(); n != 0 {
				t.Errorf("%d endpoints from a slice labelled %s, want 0", n, label)
			}

			tr.OnEndpointSlice(labelled, es)
			expect(t, snap(t, tr, svcs(a), slices1(es)), "default/a:http/TCP")
			if n := endpoints(); n != 1 {
				t.Errorf("%d endpoints once the label is gone, want 1", n)
			}
		})
	}
}
