package main

import (
	"strings"
	"testing"
	"time"
)

// feed writes log to a new progress in pieces that split lines, as a pipe
// does, and returns what it printed.
func feed(t *testing.T, mode, log string) string {
	t.Helper()
	var out strings.Builder
	p := newProgress(mode, &out)
	start := time.Date(2026, 11, 27, 16, 0, 0, 0, time.UTC)
	p.begin, p.now = start, func() time.Time { return start.Add(90 * time.Second) }
	for len(log) > 0 {
		n := min(37, len(log))
		if _, err := p.Write([]byte(log[:n])); err != nil {
			t.Fatal(err)
		}
		log = log[n:]
	}
	return out.String()
}

// TestProgress reads the output of a parallel run (--procs > 1).
func TestProgress(t *testing.T) {
	log := `Running Suite: Kubernetes e2e suite - /work/main/bin
Will run 3 of 7412 specs
SSSSSSSSSS
------------------------------
• [12.345 seconds]
[sig-network] DNS should provide DNS for the cluster  [Conformance] [Conformance, sig-network]
test/e2e/network/dns.go:50

  Timeline >>
  STEP: Creating a kubernetes client @ 11/27/26 16:00:01
  << Timeline
------------------------------
S
------------------------------
S [SKIPPED] [0.512 seconds]
[sig-network] Networking should check kube-proxy urls
test/e2e/network/networking.go:130
------------------------------
• [FAILED] [301.002 seconds]
[sig-network] Services [It] should serve a basic endpoint from pods  [Conformance]
test/e2e/network/service.go:790
------------------------------
[SynchronizedAfterSuite] [FAILED] [0.5 seconds]
`
	want := `[nftables 0/3 1m30s] ginkgo will run 3 of 7412 specs
[nftables 1/3 1m30s] passed  [sig-network] DNS should provide DNS for the cluster  [Conformance] [Conformance, sig-network]
[nftables 2/3 1m30s] skipped [sig-network] Networking should check kube-proxy urls
[nftables 3/3 1m30s, 1 failed] failed  [sig-network] Services [It] should serve a basic endpoint from pods  [Conformance]
[nftables 3/3 1m30s, 2 failed] failed SynchronizedAfterSuite
`
	if got := feed(t, "nftables", log); got != want {
		t.Errorf("progress:\n%s\nwant:\n%s", got, want)
	}
}

// TestProgressSerial reads the output of a serial run (--procs 1), where
// a passed spec's text comes before its header.
func TestProgressSerial(t *testing.T) {
	log := `Will run 2 of 7579 specs
------------------------------
[SynchronizedBeforeSuite] 
k8s.io/kubernetes@v1.36.3/test/e2e/e2e.go:69
[SynchronizedBeforeSuite] PASSED [0.000 seconds]
------------------------------
SSSSSSSS
------------------------------
[sig-network] Services should find a service from listing all namespaces [Conformance] [sig-network, Conformance]
k8s.io/kubernetes@v1.36.3/test/e2e/network/service.go:3243
  STEP: Creating a kubernetes client @ 11/27/26 16:00:01
• [3.100 seconds]
------------------------------
SSSS
------------------------------
[sig-network] DNS should provide DNS for services [Conformance] [sig-network, Conformance]
k8s.io/kubernetes@v1.36.3/test/e2e/network/dns.go:137
• [FAILED] [120.000 seconds]
[sig-network] DNS [It] should provide DNS for services [Conformance] [sig-network, Conformance]
k8s.io/kubernetes@v1.36.3/test/e2e/network/dns.go:137
------------------------------

Ran 2 of 7579 Specs in 123.1 seconds
`
	want := `[iptables 0/2 1m30s] ginkgo will run 2 of 7579 specs
[iptables 1/2 1m30s] passed  [sig-network] Services should find a service from listing all namespaces [Conformance] [sig-network, …
[iptables 2/2 1m30s, 1 failed] failed  [sig-network] DNS [It] should provide DNS for services [Conformance] [sig-network, Conformance]
`
	if got := feed(t, "iptables", log); got != want {
		t.Errorf("progress:\n%s\nwant:\n%s", got, want)
	}
}
