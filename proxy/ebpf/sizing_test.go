package ebpf

import (
	"strings"
	"testing"
)

// TestCTMaxFor: a quarter percent of the node's memory in flows, a power
// of two, within bounds.
func TestCTMaxFor(t *testing.T) {
	for _, tc := range []struct {
		mem  uint64
		want int
	}{
		{0, 1 << 16}, {2 << 30, 1 << 16}, {23 << 30, 1 << 18}, {64 << 30, 1 << 19}, {1 << 50, MaxCTMax},
	} {
		if got := CTMaxFor(tc.mem); got != tc.want {
			t.Errorf("CTMaxFor(%d GiB) = %d, want %d", tc.mem>>30, got, tc.want)
		}
	}
}

// TestBadCTMax: a size outside the bounds fails at start, naming the flag.
func TestBadCTMax(t *testing.T) {
	for _, n := range []int{-1, MinCTMax - 1, MaxCTMax + 1} {
		if _, err := New(Config{CTMax: n}); err == nil || !strings.Contains(err.Error(), "--bpf-ct-max") {
			t.Errorf("CTMax %d: %v, want an error naming --bpf-ct-max", n, err)
		}
	}
}
