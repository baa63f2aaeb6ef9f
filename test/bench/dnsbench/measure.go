package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/weftnet/weft/internal/netnsutil"
)

// listen is where each server answers, inside the node namespace.
const (
	listenIP   = "127.0.0.1"
	listenPort = "5353"
)

type env struct {
	o       options
	dir, kc string
	ns      string // the node namespace the servers and dnsperf run in
	queries string
}

type subject struct {
	name string
	args func(e *env) ([]string, error)
}

func subjects() []subject {
	return []subject{
		{"weft", func(e *env) ([]string, error) {
			return []string{filepath.Join(e.o.bin, "weft-dns"), "--kubeconfig", e.kc, "--listen", listenIP + ":" + listenPort,
				"--upstream", listenIP + ":1", "--metrics-addr", listenIP + ":9153", "--health-addr", listenIP + ":8080"}, nil
		}},
		{"coredns", func(e *env) ([]string, error) {
			corefile := filepath.Join(e.dir, "Corefile")
			conf := fmt.Sprintf("%s:%s {\n    bind %s\n    errors\n    kubernetes %s {\n        kubeconfig %s\n    }\n    cache 30\n}\n",
				zone, listenPort, listenIP, zone, e.kc)
			if err := os.WriteFile(corefile, []byte(conf), 0o644); err != nil {
				return nil, err
			}
			return []string{filepath.Join(e.o.bin, "coredns"), "-conf", corefile}, nil
		}},
	}
}

type result struct {
	ready          time.Duration // start until every Service answered
	qps, avgLat    float64       // throughput run
	lost, rcodes   string
	p50, p99       time.Duration // latency run
	latQPS         float64
	latN           int
	rssKiB, hwmKiB int64
	err            error
}

func (e *env) start(name string, cpu string, args []string, out *os.File) (*exec.Cmd, error) {
	cmd := exec.Command("taskset", append([]string{"-c", cpu}, args...)...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := netnsutil.Do(e.ns, cmd.Start); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	return cmd, nil
}

func (e *env) measure(ctx context.Context, s subject) (r result) {
	args, err := s.args(e)
	if err != nil {
		return result{err: err}
	}
	logf, err := os.Create(filepath.Join(e.dir, s.name+".log"))
	if err != nil {
		return result{err: err}
	}
	defer logf.Close()
	begin := time.Now()
	srv, err := e.start(s.name, e.o.serverCPU, args, logf)
	if err != nil {
		return result{err: err}
	}
	defer func() {
		_ = srv.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = srv.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = srv.Process.Kill()
			<-done
		}
	}()
	if err := e.waitReady(ctx, srv); err != nil {
		return result{err: fmt.Errorf("%w (log %s)", err, logf.Name())}
	}
	r.ready = time.Since(begin)
	fmt.Printf("   %-8s answers every Service %.1fs after start; warm-up %s\n", s.name, r.ready.Seconds(), e.o.warmup)
	if _, err := e.dnsperf(ctx, e.o.warmup, false); err != nil {
		return result{err: err}
	}
	out, err := e.dnsperf(ctx, e.o.duration, false)
	if err != nil {
		return result{err: err}
	}
	r.qps, r.avgLat, r.lost, r.rcodes = summary(out)
	fmt.Printf("   %-8s throughput run: %.0f qps, average latency %.3f ms, lost %s, %s\n", s.name, r.qps, r.avgLat*1e3, r.lost, r.rcodes)
	out, err = e.dnsperf(ctx, e.o.duration, true)
	if err != nil {
		return result{err: err}
	}
	r.latQPS, _, _, _ = summary(out)
	lats := latencies(out)
	r.latN = len(lats)
	if len(lats) == 0 {
		return result{err: errors.New("dnsperf -v reported no latencies")}
	}
	r.p50, r.p99 = lats[len(lats)*50/100], lats[len(lats)*99/100]
	fmt.Printf("   %-8s latency run (-v): %.0f qps, p50 %.3f ms, p99 %.3f ms over %d queries\n", s.name, r.latQPS, ms(r.p50), ms(r.p99), r.latN)
	r.rssKiB, r.hwmKiB = procStatus(srv.Process.Pid, "VmRSS"), procStatus(srv.Process.Pid, "VmHWM")
	return r
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// waitReady polls until the first and the last Service both answer.
func (e *env) waitReady(ctx context.Context, srv *exec.Cmd) error {
	deadline := time.Now().Add(3 * time.Minute)
	for {
		ok := true
		for _, i := range []int{0, e.o.services - 1} {
			if !e.answers(fqdn(i)) {
				ok = false
				break
			}
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("not answering every Service after 3 minutes")
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

func (e *env) answers(name string) bool {
	var conn net.Conn
	if err := netnsutil.Do(e.ns, func() (err error) {
		conn, err = net.Dial("udp", net.JoinHostPort(listenIP, listenPort))
		return err
	}); err != nil {
		return false
	}
	defer conn.Close()
	m := new(mdns.Msg)
	m.SetQuestion(name, mdns.TypeA)
	c := &mdns.Client{Timeout: time.Second}
	r, _, err := c.ExchangeWithConn(m, &mdns.Conn{Conn: conn})
	return err == nil && r.Rcode == mdns.RcodeSuccess && len(r.Answer) == 1
}

// dnsperf runs dnsperf on the client CPU and returns its output.
func (e *env) dnsperf(ctx context.Context, d time.Duration, verbose bool) (string, error) {
	args := []string{"-c", e.o.clientCPU, "dnsperf", "-s", listenIP, "-p", listenPort, "-d", e.queries,
		"-c", strconv.Itoa(e.o.clients), "-l", strconv.Itoa(int(d.Seconds()))}
	if verbose {
		args = append(args, "-v")
	}
	path := filepath.Join(e.dir, "dnsperf.out")
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	cmd := exec.CommandContext(ctx, "taskset", args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := netnsutil.Do(e.ns, cmd.Start); err != nil {
		return "", fmt.Errorf("starting dnsperf: %w", err)
	}
	if err := cmd.Wait(); err != nil {
		b, _ := os.ReadFile(path)
		return "", fmt.Errorf("dnsperf: %w\n%s", err, tail(string(b), 20))
	}
	b, err := os.ReadFile(path)
	return string(b), err
}

var (
	qpsRE  = regexp.MustCompile(`Queries per second:\s+([0-9.]+)`)
	avgRE  = regexp.MustCompile(`Average Latency \(s\):\s+([0-9.]+)`)
	lostRE = regexp.MustCompile(`Queries lost:\s+(.*)`)
	rcRE   = regexp.MustCompile(`Response codes:\s+(.*)`)
)

func summary(out string) (qps, avg float64, lost, rcodes string) {
	if m := qpsRE.FindStringSubmatch(out); m != nil {
		qps, _ = strconv.ParseFloat(m[1], 64)
	}
	if m := avgRE.FindStringSubmatch(out); m != nil {
		avg, _ = strconv.ParseFloat(m[1], 64)
	}
	if m := lostRE.FindStringSubmatch(out); m != nil {
		lost = strings.TrimSpace(m[1])
	}
	if m := rcRE.FindStringSubmatch(out); m != nil {
		rcodes = strings.TrimSpace(m[1])
	}
	return qps, avg, lost, rcodes
}

// latencies parses dnsperf -v lines ("> NOERROR name A 0.000152"), sorted.
func latencies(out string) []time.Duration {
	var lats []time.Duration
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, "> ") {
			continue
		}
		f := strings.Fields(l)
		if s, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			lats = append(lats, time.Duration(s*float64(time.Second)))
		}
	}
	slices.Sort(lats)
	return lats
}

func procStatus(pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, field+":") {
			f := strings.Fields(l)
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return 0
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
