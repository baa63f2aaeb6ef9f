package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/internal/testutil"
	"github.com/weftnet/weft/lab/workload"
	"github.com/weftnet/weft/proxy/proxytest"
	"github.com/weftnet/weft/proxy/userspace"
)

// mainArgsEnv makes the test binary run weft-proxy's main with these
// arguments (a JSON list) instead of the tests: how TestRootless runs
// weft-proxy as another user.
const mainArgsEnv = "WEFT_PROXY_TEST_MAIN_ARGS"

func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv(mainArgsEnv); ok {
		os.Args = []string{"weft-proxy"}
		if err := json.Unmarshal([]byte(args), &os.Args); err != nil {
			fmt.Fprintln(os.Stderr, mainArgsEnv, err)
			os.Exit(2)
		}
		os.Args = append([]string{"weft-proxy"}, os.Args...)
		main()
		os.Exit(0)
	}
	os.Exit(netnsutil.RunTests(m))
}

// nobody is the unprivileged user the rootless proxy runs as.
const nobody = 65534

// The manifests: web (two pods, HTTP and TCP echo, privileged ports, so
// the proxy takes ports of the range), dns (UDP), high (an unprivileged
// port, free: the proxy listens on it), and crowded, whose second port
// finds the range (three ports, web's two and crowded's first took them)
// full: it is reported, the rest works.
const services = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80}, {name: echo, port: 81}]
---
apiVersion: v1
kind: Service
metadata: {name: dns, namespace: default}
spec:
  clusterIP: 10.96.0.53
  ports: [{name: dns, port: 53, protocol: UDP}]
---
apiVersion: v1
kind: Service
metadata: {name: high, namespace: default}
spec:
  clusterIP: 10.96.0.11
  ports: [{name: http, port: %d}]
---
apiVersion: v1
kind: Service
metadata: {name: zz-crowded, namespace: default}
spec:
  clusterIP: 10.96.0.12
  ports: [{name: a, port: 82}, {name: b, port: 83}]
`

// slice is an EndpointSlice of svc with ports named as web's, dns's and
// high's, all served by the workload on 80 and 81.
func slice(svc string, ips ...string) string {
	var eps strings.Builder
	for _, ip := range ips {
		fmt.Fprintf(&eps, "  - addresses: [%s]\n    conditions: {ready: true}\n", ip)
	}
	return fmt.Sprintf(`apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: %s-1
  namespace: default
  labels: {kubernetes.io/service-name: %s}
addressType: IPv4
ports: [{name: http, port: 80}, {name: echo, port: 81}, {name: dns, port: 81, protocol: UDP}, {name: a, port: 80}, {name: b, port: 80}]
endpoints:
%s`, svc, svc, eps.String())
}

// TestRootless runs weft-proxy --mode userspace --userspace-listen
// 127.0.0.1 as an unprivileged user (uid 65534, no capabilities) from a
// manifest directory, in the test's private network namespace, with two
// workload pods on addresses of the loopback. It reads the service map on
// the metrics address and dials the listeners: round robin over both
// pods, TCP echo, UDP, a Service's own unprivileged port, a port that
// cannot be bound reported with its Service and port; then an edited
// EndpointSlice reaches the map while a connection to the pod that stays
// keeps working.
func TestRootless(t *testing.T) {
	if testing.Short() || !netnsutil.Isolated() {
		t.Skip("needs root (a private network namespace, and a user to switch to), not -short")
	}
	dir := t.TempDir()
	// The proxy runs as nobody: it must reach its copy of the binary and
	// the manifests (the test's temp dirs are root's, 0700).
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	manifests := filepath.Join(dir, "manifests")
	if err := os.Mkdir(manifests, 0o755); err != nil {
		t.Fatal(err)
	}
	high := freePort(t)
	write := func(name, body string) {
		t.Helper()
		tmp := filepath.Join(manifests, "."+name)
		if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(manifests, name)); err != nil {
			t.Fatal(err)
		}
	}
	write("services.yaml", fmt.Sprintf(services, high))
	var slices []string
	for _, svc := range []string{"web", "dns", "high", "zz-crowded"} {
		slices = append(slices, slice(svc, proxytest.PodA, proxytest.PodB))
	}
	write("slices.yaml", strings.Join(slices, "---\n"))

	// The pods: workloads on addresses of the loopback.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	for name, ip := range map[string]string{"a": proxytest.PodA, "b": proxytest.PodB} {
		if out, err := exec.Command("ip", "addr", "add", ip+"/32", "dev", "lo").CombinedOutput(); err != nil {
			t.Fatalf("ip addr add %s: %v %s", ip, err, out)
		}
		ready := make(chan struct{})
		go func() {
			_ = workload.Run(ctx, workload.Options{Name: name, HTTPAddrs: []string{ip + ":80"}, TCPEchoAddrs: []string{ip + ":81"},
				UDPEchoAddrs: []string{ip + ":81"}}, func() { close(ready) })
		}()
		<-ready
	}

	metrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	logs := startProxy(t, dir, "--mode", "userspace", "--userspace-listen", "127.0.0.1", "--manifests", manifests,
		"--metrics-addr", metrics, "--healthz-addr", "", "--node-name", proxytest.NodeName, "--userspace-port-range", "20000-20002")

	var entries []userspace.MapEntry
	get := func(svc, port string) userspace.MapEntry {
		for _, e := range entries {
			if e.Service == "default/"+svc && e.Port == port {
				return e
			}
		}
		return userspace.MapEntry{}
	}
	read := func() bool {
		resp, err := http.Get("http://" + metrics + "/services")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		entries = nil
		return json.NewDecoder(resp.Body).Decode(&entries) == nil && len(entries) == 6
	}
	testutil.Eventually(t, 20*time.Second, "the service map with 6 listeners on "+metrics+"/services", read)

	web := get("web", "http")
	if !strings.HasPrefix(web.Address, "127.0.0.1:2000") || len(web.Endpoints) != 2 {
		t.Fatalf("web/http: %+v, want a port of the range (80 is privileged) and both pods", web)
	}
	seen := map[string]bool{}
	for range 4 {
		r, err := workload.HTTPGet(ctx, "http://"+web.Address+"/")
		if err != nil {
			t.Fatal(err)
		}
		seen[r.Pod] = true
	}
	if !seen["a"] || !seen["b"] {
		t.Fatalf("4 requests went to %v, want both pods", seen)
	}
	if got := get("high", "http").Address; got != fmt.Sprintf("127.0.0.1:%d", high) {
		t.Fatalf("high listens on %q, want its own port %d", got, high)
	}
	if r, err := workload.HTTPGet(ctx, "http://"+get("high", "http").Address+"/"); err != nil {
		t.Fatalf("high: %+v %v", r, err)
	}
	if got, err := workload.UDPExchange(ctx, get("dns", "dns").Address, "ping"); err != nil || !strings.Contains(got, "ping") {
		t.Fatalf("dns over UDP: %q %v", got, err)
	}
	crowded := get("zz-crowded", "b")
	if crowded.Address != "" || !strings.Contains(crowded.Error, "service default/zz-crowded port b (83/TCP)") {
		t.Fatalf("zz-crowded/b: %+v, want no listener and an error naming the Service and port", crowded)
	}
	testutil.Eventually(t, 10*time.Second, "the log naming zz-crowded's port b", func() bool {
		return strings.Contains(logs.String(), "service default/zz-crowded port b (83/TCP): no port to listen on")
	})
	if r, err := workload.HTTPGet(ctx, "http://"+get("zz-crowded", "a").Address+"/"); err != nil {
		t.Fatalf("zz-crowded/a beside the failing port: %+v %v", r, err)
	}

	// An established connection to b; a leaves the Service.
	echo := get("web", "echo").Address
	var toB net.Conn
	var rd *bufio.Reader
	for toB == nil {
		c, err := net.Dial("tcp", echo)
		if err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(c)
		fmt.Fprintln(c, "hello")
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("echo: %v", err)
		}
		if strings.HasPrefix(line, "b ") {
			toB, rd = c, r
			defer c.Close()
		} else {
			c.Close()
		}
	}
	talk := func(msg string) {
		t.Helper()
		_ = toB.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintln(toB, msg)
		if got, err := rd.ReadString('\n'); err != nil || strings.TrimSpace(got) != msg {
			t.Fatalf("echo of %q: %q %v", msg, got, err)
		}
	}
	talk("before")
	slices[0] = slice("web", proxytest.PodB)
	write("slices.yaml", strings.Join(slices, "---\n"))
	testutil.Eventually(t, 20*time.Second, "web's endpoints in the map down to b", func() bool {
		return read() && len(get("web", "http").Endpoints) == 1 && get("web", "http").Endpoints[0] == proxytest.PodB+":80"
	})
	talk("after a left the Service")
	if got := get("web", "echo").Address; got != echo {
		t.Fatalf("web/echo moved from %s to %s", echo, got)
	}
	for range 3 {
		if r, err := workload.HTTPGet(ctx, "http://"+web.Address+"/"); err != nil || r.Pod != "b" {
			t.Fatalf("after a left: %+v %v", r, err)
		}
	}
	if out, err := exec.Command("nft", "list", "ruleset").CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("kernel rules in the namespace (%v):\n%s", err, out)
	}
}

// startProxy runs weft-proxy with args as nobody (a copy of the test
// binary in dir), stopped when the test ends; its log is returned.
func startProxy(t *testing.T, dir string, args ...string) *testutil.SyncBuffer {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "weft-proxy.test")
	if err := copyFile(self, bin); err != nil {
		t.Fatal(err)
	}
	logs := &testutil.SyncBuffer{}
	cmd := exec.Command(bin)
	encoded, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(os.Environ(), mainArgsEnv+"="+string(encoded))
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("weft-proxy's log:\n%s", logs.String())
		}
	})
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{fmt.Sprintf("Uid:\t%d\t%d\t%d\t%d", nobody, nobody, nobody, nobody), "CapEff:\t0000000000000000"} {
		if !strings.Contains(string(status), want) {
			t.Fatalf("weft-proxy does not run unprivileged (no %q):\n%s", want, status)
		}
	}
	return logs
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// freePort is a TCP port nothing listens on in the test's namespace.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
