package nftables

import "testing"

func TestNextSize(t *testing.T) {
	for _, c := range []struct {
		cur  uint8
		n    int
		want uint8
	}{
		{0, 0, 0},
		{0, sizedFrom - 1, 0},    // small: a resizable hash
		{0, sizedFrom, minSized}, // 8192 + 2048 fit 2^14
		{0, 13107, minSized},     // 13107 + 3276 = 16383 fit 2^14
		{0, 13108, 15},           // 13108 + 3277 = 16385 do not
		{0, 2_000_000, 22},       // 2.5M fit 2^22
		{14, 16384, 14},          // full, but fits: kept
		{14, 16385, 15},          // past the limit: grown
		{15, 4096, 15},           // an eighth full: kept
		{15, 4095, 0},            // less: back to a resizable hash
		{22, 400_000, 19},        // shrunk to fit 500k
		{14, sizedFrom - 1, 14},  // under sizedFrom but not an eighth: kept
	} {
		if got := nextSize(c.cur, c.n); got != c.want {
			t.Errorf("nextSize(%d, %d) = %d, want %d", c.cur, c.n, got, c.want)
		}
	}
}

func TestAdoptSize(t *testing.T) {
	for _, c := range []struct {
		kernel, m string
		e         uint8
		ok        bool
	}{
		{"lb4-10-s22", "lb4-10", 22, true},
		{"lb-cluster6-3-s14", "lb-cluster6-3", 14, true},
		{"lb4-10", "", 0, false},
		{"lb4-10-s13", "", 0, false}, // below the smallest class
		{"lb4-10-s40", "", 0, false},
		{"lb4-10-sx", "", 0, false},
		{"clients4-10800", "", 0, false},
		{"clusterip4", "", 0, false},
	} {
		m, e, ok := adoptSize(c.kernel)
		if m != c.m || e != c.e || ok != c.ok {
			t.Errorf("adoptSize(%q) = %q %d %v, want %q %d %v", c.kernel, m, e, ok, c.m, c.e, c.ok)
		}
	}
	z := lbSizes{"lb4-10": 22}
	if got := z.kernelName("lb4-10"); got != "lb4-10-s22" {
		t.Errorf("kernelName = %q", got)
	}
	if got := z.kernelName("lb4-3"); got != "lb4-3" {
		t.Errorf("kernelName of an unsized map = %q", got)
	}
}
