// Package testutil holds helpers shared by weft's tests.
package testutil

import (
	"bytes"
	"sync"
	"testing"
	"time"
)

// Eventually polls cond until it holds, failing t with what after within.
// It waits for a state, not a duration: within only bounds a hang.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// SyncBuffer is a bytes.Buffer that goroutines (a process's output and a
// test reading it) may use at once.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
