package vm

import (
	"strings"
	"testing"
)

// TestParseConsole splits a console into the binaries' results: markers
// may follow the console's escape sequences and carriage returns, and a
// binary the guest never finished has no exit status.
func TestParseConsole(t *testing.T) {
	g := Guest{Binaries: []Binary{{Name: "a"}, {Name: "b"}, {Name: "c"}}}
	console := "SeaBIOS\r\n\x1bc\x1b[?7l\x1b[2J" + runMarker + " a\r\n=== RUN TestX\r\n--- PASS: TestX\r\nPASS\r\n" + exitMarker + " a 0\r\n" +
		runMarker + " b\r\n--- FAIL: TestY\r\nno newline at the end" + exitMarker + " b 1\r\n" +
		runMarker + " c\r\n=== RUN TestZ\r\n[   12.3] kernel panic\r\n"
	res := parse(strings.NewReader(console), g)
	want := []Result{
		{Name: "a", Code: 0, Output: "=== RUN TestX\n--- PASS: TestX\nPASS\n"},
		{Name: "b", Code: 1, Output: "--- FAIL: TestY\nno newline at the end"},
		{Name: "c", Code: -1, Output: "=== RUN TestZ\n[   12.3] kernel panic\n"},
	}
	for i := range want {
		if res[i] != want[i] {
			t.Errorf("binary %d: %+v, want %+v", i, res[i], want[i])
		}
	}
}
