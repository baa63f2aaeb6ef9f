package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/internal/testutil"
)

func TestMain(m *testing.M) { os.Exit(netnsutil.RunTests(m)) }

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestFlagErrors: bad flags fail with an error naming the flag, before
// anything is served.
func TestFlagErrors(t *testing.T) {
	dir := t.TempDir()
	ok := flags{manifests: dir, zone: "cluster.local", listen: "127.0.0.1:0", upstream: "127.0.0.1", podRecords: "disabled", ttl: 5, cacheSize: 10}
	for _, c := range []struct {
		name string
		mod  func(*flags)
		want string
	}{
		{"no source", func(f *flags) { f.manifests = "" }, "--kubeconfig, --in-cluster and --manifests"},
		{"two sources", func(f *flags) { f.kubeconfig = "x" }, "--kubeconfig, --in-cluster and --manifests"},
		{"manifests and in-cluster", func(f *flags) { f.inCluster = true }, "--kubeconfig, --in-cluster and --manifests"},
		{"pod records", func(f *flags) { f.podRecords = "insecure" }, "--pod-records"},
		{"zone", func(f *flags) { f.zone = "bad..zone" }, "--zone"},
		{"empty zone", func(f *flags) { f.zone = "." }, "--zone"},
		{"upstream", func(f *flags) { f.upstream = "dns.example" }, "--upstream"},
		{"ttl", func(f *flags) { f.ttl = 1 << 40 }, "--ttl"},
		{"listen", func(f *flags) { f.listen = "256.0.0.1:53" }, "--listen"},
		{"resolv.conf", func(f *flags) { f.upstream, f.resolvConf = "", filepath.Join(dir, "none") }, "--upstream not given"},
		{"manifest dir", func(f *flags) { f.manifests = filepath.Join(dir, "none") }, "--manifests"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := ok
			c.mod(&f)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := run(ctx, f, quiet())
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error mentioning %q", err, c.want)
			}
		})
	}
}

const manifest = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80}]
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: default}
spec: {containers: [{name: c, image: x}]}
status: {phase: Running, podIP: 10.244.1.7, podIPs: [{ip: 10.244.1.7}]}
`

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestManifests runs weft-dns on a manifest directory: ready after the
// first load, answers, and picks up a changed file.
func TestManifests(t *testing.T) {
	if !netnsutil.Isolated() {
		t.Skip("socket test: needs root to run in a private network namespace")
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "objects.yaml")
	if err := os.WriteFile(file, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	dnsAddr, healthAddr, metricsAddr := freePort(t), freePort(t), freePort(t)
	f := flags{manifests: dir, zone: "cluster.local", listen: dnsAddr, upstream: "127.0.0.1:1", podRecords: "verified",
		ttl: 5, cacheSize: 10, cacheMaxTTL: time.Minute, cacheMaxNeg: time.Minute, health: healthAddr, metrics: metricsAddr}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, f, quiet()) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	testutil.Eventually(t, 10*time.Second, "/readyz", func() bool {
		r, err := http.Get("http://" + healthAddr + "/readyz")
		if err != nil {
			return false
		}
		r.Body.Close()
		return r.StatusCode == http.StatusOK
	})
	answer := func(name string) string {
		c := &mdns.Client{Timeout: time.Second}
		m := new(mdns.Msg)
		m.SetQuestion(name, mdns.TypeA)
		r, _, err := c.Exchange(m, dnsAddr)
		if err != nil || len(r.Answer) != 1 {
			return ""
		}
		return r.Answer[0].(*mdns.A).A.String()
	}
	if got := answer("web.default.svc.cluster.local."); got != "10.96.0.10" {
		t.Fatalf("web: %q", got)
	}
	if got := answer("10-244-1-7.default.pod.cluster.local."); got != "10.244.1.7" {
		t.Fatalf("pod record from the manifest: %q", got)
	}
	if err := os.WriteFile(file, []byte(strings.Replace(manifest, "10.96.0.10", "10.96.0.11", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the changed file", func() bool { return answer("web.default.svc.cluster.local.") == "10.96.0.11" })

	r, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(r.Body)
	r.Body.Close()
	for _, re := range []string{`weft_dns_requests_total\{proto="udp"\} [1-9]`, `weft_dns_responses_total\{rcode="NOERROR"\} [1-9]`,
		`weft_dns_fast_path_total [1-9]`, `weft_dns_ready 1`, `weft_dns_index_names [1-9]`} {
		if !regexp.MustCompile(re).Match(body) {
			t.Errorf("/metrics has no %s", re)
		}
	}
}

// TestNotReady: with an API server that never answers, /readyz stays 503
// and names of the zone get SERVFAIL, never a false NXDOMAIN.
func TestNotReady(t *testing.T) {
	if !netnsutil.Isolated() {
		t.Skip("socket test: needs root to run in a private network namespace")
	}
	dead := freePort(t) // nothing listens there any more
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	conf := "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://" + dead + "'}}]\n" +
		"users: [{name: u, user: {token: x}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
	if err := os.WriteFile(kc, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	dnsAddr, healthAddr := freePort(t), freePort(t)
	f := flags{kubeconfig: kc, zone: "cluster.local", listen: dnsAddr, upstream: "127.0.0.1:1", podRecords: "disabled",
		ttl: 5, cacheSize: 10, cacheMaxTTL: time.Minute, cacheMaxNeg: time.Minute, health: healthAddr}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, f, quiet()) }()
	defer func() { cancel(); <-done }()
	testutil.Eventually(t, 10*time.Second, "/healthz", func() bool {
		r, err := http.Get("http://" + healthAddr + "/healthz")
		if err != nil {
			return false
		}
		r.Body.Close()
		return r.StatusCode == http.StatusOK
	})
	r, err := http.Get("http://" + healthAddr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/readyz before any sync: %d", r.StatusCode)
	}
	c := &mdns.Client{Timeout: 5 * time.Second}
	m := new(mdns.Msg)
	m.SetQuestion("nope.default.svc.cluster.local.", mdns.TypeA)
	resp, _, err := c.Exchange(m, dnsAddr)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Rcode != mdns.RcodeServerFailure {
		t.Errorf("zone name before the first sync: %s, want SERVFAIL", mdns.RcodeToString[resp.Rcode])
	}
}
