package ipam

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
)

// StateVersion is the "version" written in, and required of, State.
const StateVersion = 1

// ErrCorruptState is wrapped by the error a Store returns when the
// persisted state cannot be understood.
var ErrCorruptState = errors.New("corrupt ipam state")

// Key identifies one allocation: one interface of one container.
type Key struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
}

func (k Key) String() string { return k.ContainerID + "/" + k.IfName }

func (k Key) compare(o Key) int {
	return cmp.Or(cmp.Compare(k.ContainerID, o.ContainerID), cmp.Compare(k.IfName, o.IfName))
}

// Lease is one allocated address. Address carries the subnet's prefix
// length (10.244.1.7/24).
type Lease struct {
	Address netip.Prefix `json:"address"`
	Gateway netip.Addr   `json:"gateway,omitzero"`
}

// Allocation is the addresses held by one key, one per range set, in
// range-set order.
type Allocation struct {
	Key
	Addresses []netip.Addr `json:"addresses"`
	// Pod is the Kubernetes pod the attachment was made for, when the
	// runtime named it (optional).
	Pod *PodRef `json:"pod,omitempty"`
}

// PodRef names the Kubernetes pod of an allocation, as the runtime passes
// it in CNI_ARGS (K8S_POD_NAMESPACE, K8S_POD_NAME, K8S_POD_UID): the node
// agent ties a new attachment to its Pod object with it before the API
// server reports the pod's address.
type PodRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid,omitempty"`
}

// State is the persisted allocation state of one network. Use NewState
// for an empty one and the Pool methods to change it; the fields are
// exported for serialisation and inspection.
type State struct {
	// Version is StateVersion.
	Version int `json:"version"`
	// Allocations are sorted by key.
	Allocations []Allocation `json:"allocations"`
	// LastAllocated[i] is the address most recently handed out from range
	// set i (the zero Addr, serialised as "", if none); the next
	// allocation in set i starts after it.
	LastAllocated []netip.Addr `json:"lastAllocated"`
}

// NewState returns an empty State.
func NewState() *State {
	return &State{Version: StateVersion, Allocations: []Allocation{}, LastAllocated: []netip.Addr{}}
}

// Keys lists all allocated keys, sorted by container ID then interface.
func (st *State) Keys() []Key {
	keys := make([]Key, len(st.Allocations))
	for i, al := range st.Allocations {
		keys[i] = al.Key
	}
	slices.SortFunc(keys, Key.compare)
	return keys
}

// Clone returns a deep copy of st.
func (st *State) Clone() *State {
	c := &State{
		Version:       st.Version,
		Allocations:   make([]Allocation, len(st.Allocations)),
		LastAllocated: slices.Clone(st.LastAllocated),
	}
	if c.LastAllocated == nil {
		c.LastAllocated = []netip.Addr{}
	}
	for i, al := range st.Allocations {
		c.Allocations[i] = Allocation{Key: al.Key, Addresses: slices.Clone(al.Addresses)}
		if al.Pod != nil {
			pod := *al.Pod
			c.Allocations[i].Pod = &pod
		}
	}
	return c
}

// SetPod records the pod of key's allocation (none: no-op).
func (st *State) SetPod(key Key, pod *PodRef) {
	if i := st.find(key); i >= 0 {
		st.Allocations[i].Pod = pod
	}
}

// find returns the index of key's allocation, or -1.
func (st *State) find(key Key) int {
	for i := range st.Allocations {
		if st.Allocations[i].Key == key {
			return i
		}
	}
	return -1
}

// put records addrs for key, replacing any previous allocation (its pod
// stays: same attachment) and keeping Allocations sorted.
func (st *State) put(key Key, addrs []netip.Addr) {
	st.Version = StateVersion
	al := Allocation{Key: key, Addresses: slices.Clone(addrs)}
	if i := st.find(key); i >= 0 {
		al.Pod = st.Allocations[i].Pod
		st.Allocations[i] = al
		return
	}
	st.Allocations = append(st.Allocations, al)
	slices.SortStableFunc(st.Allocations, func(a, b Allocation) int { return a.Key.compare(b.Key) })
}

func (st *State) remove(i int) {
	st.Allocations = slices.Delete(st.Allocations, i, i+1)
}

// last returns the rotation position of set i.
func (st *State) last(i int) netip.Addr {
	if i < len(st.LastAllocated) {
		return st.LastAllocated[i]
	}
	return netip.Addr{}
}

// setLast records a as the rotation position of set i of n.
func (st *State) setLast(i, n int, a netip.Addr) {
	for len(st.LastAllocated) < n {
		st.LastAllocated = append(st.LastAllocated, netip.Addr{})
	}
	st.LastAllocated[i] = a
}

// MarshalState encodes st as indented JSON with a trailing newline.
func MarshalState(st *State) ([]byte, error) {
	c := st.Clone()
	if c.Version == 0 {
		c.Version = StateVersion
	}
	for i := range c.Allocations {
		if c.Allocations[i].Addresses == nil {
			c.Allocations[i].Addresses = []netip.Addr{}
		}
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode ipam state: %w", err)
	}
	return append(b, '\n'), nil
}

// UnmarshalState decodes and checks a State written by MarshalState. Its
// errors wrap ErrCorruptState.
func UnmarshalState(b []byte) (*State, error) {
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorruptState, err)
	}
	if err := st.check(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorruptState, err)
	}
	if st.Allocations == nil {
		st.Allocations = []Allocation{}
	}
	if st.LastAllocated == nil {
		st.LastAllocated = []netip.Addr{}
	}
	slices.SortStableFunc(st.Allocations, func(a, b Allocation) int { return a.Key.compare(b.Key) })
	return &st, nil
}

// check validates the structure of a decoded State.
func (st *State) check() error {
	if st.Version != StateVersion {
		return fmt.Errorf("unsupported version %d (want %d)", st.Version, StateVersion)
	}
	keys := make(map[Key]struct{}, len(st.Allocations))
	owner := make(map[netip.Addr]Key)
	for i, al := range st.Allocations {
		if al.ContainerID == "" || al.IfName == "" {
			return fmt.Errorf("allocations[%d]: containerID and ifName are required", i)
		}
		if _, dup := keys[al.Key]; dup {
			return fmt.Errorf("allocations[%d]: duplicate key %s", i, al.Key)
		}
		keys[al.Key] = struct{}{}
		if al.Pod != nil && (al.Pod.Namespace == "" || al.Pod.Name == "") {
			return fmt.Errorf("allocations[%d].pod: namespace and name are required", i)
		}
		for _, a := range al.Addresses {
			if !a.IsValid() || a.Zone() != "" {
				return fmt.Errorf("allocations[%d]: invalid address %q", i, a)
			}
			if k, dup := owner[a]; dup {
				return fmt.Errorf("allocations[%d]: address %s also held by %s", i, a, k)
			}
			owner[a] = al.Key
		}
	}
	return nil
}
