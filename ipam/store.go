package ipam

import (
	"bytes"
	"sync"
)

// Store persists the State of one network.
type Store interface {
	// Update runs fn on the current state under an exclusive lock (held
	// across processes for a DiskStore) and, if fn returns nil and changed
	// the state, persists it before releasing the lock. If fn returns an
	// error nothing is persisted and that error is returned unwrapped.
	Update(fn func(*State) error) error
	// View runs fn on the current state under the lock without persisting
	// anything fn may change.
	View(fn func(*State) error) error
}

// MemStore is an in-memory Store, safe for concurrent use, for tests.
type MemStore struct {
	mu    sync.Mutex
	st    *State
	saves int
}

var _ Store = (*MemStore)(nil)

// NewMemStore returns an empty MemStore.
func NewMemStore() *MemStore { return &MemStore{st: NewState()} }

// Update implements Store. fn works on a copy, which replaces the stored
// state only if fn succeeds and changed it.
func (m *MemStore) Update(fn func(*State) error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	work := m.st.Clone()
	if err := fn(work); err != nil {
		return err
	}
	changed, err := stateChanged(m.st, work)
	if err != nil || !changed {
		return err
	}
	m.st = work
	m.saves++
	return nil
}

// View implements Store. fn works on a copy.
func (m *MemStore) View(fn func(*State) error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return fn(m.st.Clone())
}

// Saves reports how many times Update replaced the stored state.
func (m *MemStore) Saves() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.saves
}

// stateChanged reports whether a and b serialise differently.
func stateChanged(a, b *State) (bool, error) {
	ea, err := MarshalState(a)
	if err != nil {
		return false, err
	}
	eb, err := MarshalState(b)
	if err != nil {
		return false, err
	}
	return !bytes.Equal(ea, eb), nil
}
