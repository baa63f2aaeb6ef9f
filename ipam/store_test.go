package ipam_test

import (
	"encoding/json"
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/weftnet/weft/ipam"
)

// storeContract exercises the Store semantics shared by every
// implementation.
func storeContract(t *testing.T, s ipam.Store) {
	p := mustPool(t, ipam.RangeSet{sub("10.0.0.0/24")})
	if err := s.View(func(st *ipam.State) error {
		if len(st.Keys()) != 0 {
			t.Errorf("new store has keys %v", st.Keys())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Update(func(st *ipam.State) error {
		_, err := p.Allocate(st, key("kept"))
		return err
	}); err != nil {
		t.Fatal(err)
	}

	boom := errors.New("boom")
	if err := s.Update(func(st *ipam.State) error {
		if _, err := p.Allocate(st, key("dropped")); err != nil {
			return err
		}
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("Update returned %v, want fn's error", err)
	}
	if err := s.View(func(st *ipam.State) error {
		p.Release(st, key("kept")) // must not be persisted
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.View(func(st *ipam.State) error {
		if got, want := st.Keys(), []ipam.Key{key("kept")}; !reflect.DeepEqual(got, want) {
			t.Errorf("Keys = %v, want %v", got, want)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestMemStore(t *testing.T) {
	s := ipam.NewMemStore()
	storeContract(t, s)
	if n := s.Saves(); n != 1 {
		t.Errorf("Saves = %d, want 1", n)
	}
	if err := s.Update(func(*ipam.State) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if n := s.Saves(); n != 1 {
		t.Errorf("an Update that changed nothing saved: Saves = %d", n)
	}

	p := mustPool(t, ipam.RangeSet{sub("10.1.0.0/24")})
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			if err := s.Update(func(st *ipam.State) error {
				_, err := p.Allocate(st, ipam.Key{ContainerID: "g", IfName: string(rune('a' + i))})
				return err
			}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	_ = s.View(func(st *ipam.State) error {
		if n := len(st.Keys()); n != 21 {
			t.Errorf("%d keys, want 21", n)
		}
		return nil
	})
}

func TestStateJSON(t *testing.T) {
	p := mustPool(t, ipam.RangeSet{sub("10.0.0.0/24")}, ipam.RangeSet{sub("fd00::/64")})
	st := ipam.NewState()
	alloc(t, p, st, "b")
	alloc(t, p, st, "a")
	b := encode(t, st)

	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	if raw["version"] != float64(1) {
		t.Errorf("version = %v, want 1 in %s", raw["version"], b)
	}
	for _, want := range []string{`"containerID": "a"`, `"ifName": "eth0"`, `"10.0.0.3"`, `"fd00::3"`, `"lastAllocated"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("encoded state lacks %s:\n%s", want, b)
		}
	}
	back, err := ipam.UnmarshalState(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, st) {
		t.Errorf("round trip = %+v, want %+v", back, st)
	}
	if got := string(encode(t, ipam.NewState())); got != "{\n  \"version\": 1,\n  \"allocations\": [],\n  \"lastAllocated\": []\n}\n" {
		t.Errorf("empty state encodes as %q", got)
	}

	c := st.Clone()
	c.Allocations[0].Addresses[0] = netip.MustParseAddr("10.9.9.9")
	if reflect.DeepEqual(c, st) {
		t.Error("Clone shares address slices")
	}
}

// An allocation's pod is optional: absent from the encoding without one,
// kept through a round trip, a clone and a re-allocation of its key.
func TestStatePod(t *testing.T) {
	p := mustPool(t, ipam.RangeSet{sub("10.0.0.0/24")}, ipam.RangeSet{sub("fd00::/64")})
	st := ipam.NewState()
	alloc(t, p, st, "a")
	if b := encode(t, st); strings.Contains(string(b), `"pod"`) {
		t.Fatalf("allocation without a pod encodes one:\n%s", b)
	}
	k := ipam.Key{ContainerID: "a", IfName: "eth0"}
	st.SetPod(k, &ipam.PodRef{Namespace: "x", Name: "web-1", UID: "u1"})
	back, err := ipam.UnmarshalState(encode(t, st))
	if err != nil {
		t.Fatal(err)
	}
	if got := back.Allocations[0].Pod; got == nil || *got != (ipam.PodRef{Namespace: "x", Name: "web-1", UID: "u1"}) {
		t.Fatalf("pod after a round trip: %+v", got)
	}
	c := st.Clone()
	c.Allocations[0].Pod.Name = "other"
	if st.Allocations[0].Pod.Name != "web-1" {
		t.Error("Clone shares the pod")
	}
	if _, err := p.Allocate(st, k); err != nil {
		t.Fatal(err)
	}
	if st.Allocations[0].Pod == nil {
		t.Error("a repeated allocation of the key lost its pod")
	}
}

func TestUnmarshalStateInvalid(t *testing.T) {
	for name, in := range map[string]string{
		"not json":       "garbage",
		"truncated":      `{"version": 1, "allocations": [`,
		"empty":          "",
		"no version":     `{"allocations": []}`,
		"future version": `{"version": 2}`,
		"bad address":    `{"version": 1, "allocations": [{"containerID": "a", "ifName": "eth0", "addresses": ["10.0.0.300"]}]}`,
		"empty address":  `{"version": 1, "allocations": [{"containerID": "a", "ifName": "eth0", "addresses": [""]}]}`,
		"no id":          `{"version": 1, "allocations": [{"ifName": "eth0", "addresses": []}]}`,
		"duplicate key": `{"version": 1, "allocations": [{"containerID": "a", "ifName": "eth0", "addresses": []},
			{"containerID": "a", "ifName": "eth0", "addresses": []}]}`,
		"shared address": `{"version": 1, "allocations": [{"containerID": "a", "ifName": "eth0", "addresses": ["10.0.0.2"]},
			{"containerID": "b", "ifName": "eth0", "addresses": ["10.0.0.2"]}]}`,
		"pod without name": `{"version": 1, "allocations": [{"containerID": "a", "ifName": "eth0", "addresses": [], "pod": {"namespace": "x"}}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			st, err := ipam.UnmarshalState([]byte(in))
			if !errors.Is(err, ipam.ErrCorruptState) {
				t.Errorf("UnmarshalState = %+v, %v; want ErrCorruptState", st, err)
			}
		})
	}
}
