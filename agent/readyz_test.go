package agent

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestReadyz: /readyz fails, naming it, while a component's last sync
// failed; /healthz (liveness) follows the node sync alone.
func TestReadyz(t *testing.T) {
	a := New(nil, Options{NodeName: "n1"})
	proxyOK := false
	h := a.Handler([]ReadyCheck{{Name: "service proxy (ebpf)", OK: func() bool { return proxyOK }}})
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "node sync") {
		t.Fatalf("before any sync: /readyz %d %q", code, body)
	}
	a.lastGood.Store(time.Now().UnixNano())
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "service proxy (ebpf)") || strings.Contains(body, "node sync") {
		t.Fatalf("proxy failing: /readyz %d %q, want 503 naming the proxy", code, body)
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Fatalf("proxy failing: /healthz %d, want 200 (liveness follows the node sync)", code)
	}
	proxyOK = true
	if code, body := get("/readyz"); code != http.StatusOK {
		t.Fatalf("all synced: /readyz %d %q", code, body)
	}
}
