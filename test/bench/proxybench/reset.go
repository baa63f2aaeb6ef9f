package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weftnet/weft/internal/netnsutil"
)

// The reset measurement (-reset): in each proxy's box, a client pod and a
// server pod (as for -conn) and a Service reset-target whose one endpoint
// is the server. The client, a child process in the client pod and the
// bench's cgroup, opens resetConns connections to the ClusterIP and waits
// on each for data the server never sends. The bench then cuts the
// server's veth (the pod vanishes: no FIN, no reset, as a node that died
// or a pod force-deleted) and deletes the Service's EndpointSlice; from
// just before that API write, each connection's time until the client's
// read fails with ECONNRESET is taken. A read still waiting resetCap
// later counts as a hang (kube-proxy resets nothing: its clients wait for
// their own timeout, kubernetes#108523).
const (
	resetSvc   = "reset-target"
	resetPort  = 9092
	resetConns = 20
	resetCap   = 10 * time.Second
)

var (
	resetClient = netip.MustParseAddr("10.244.250.5")
	resetServer = netip.MustParseAddr("10.244.250.4")
)

// resetResult is one proxy's reset times: of the connections reset, and
// how many were (of resetConns).
type resetResult struct {
	times []time.Duration
	err   error
}

// resetTimes measures in box b, whose proxy has programmed every Service.
func (e *env) resetTimes(ctx context.Context, b *box) resetResult {
	client, stop, err := b.clientServer("rclient", resetClient, "rserver", resetServer, "reset-server")
	if err != nil {
		return resetResult{err: err}
	}
	defer stop()
	eps := e.client.DiscoveryV1().EndpointSlices(benchNS)
	if _, err := eps.Create(ctx, targetSlice(resetSvc, resetPort, resetServer), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return resetResult{err: fmt.Errorf("creating %s's EndpointSlice: %w", resetSvc, err)}
	}
	pr, pw := io.Pipe()
	var errb strings.Builder
	cmd, err := e.startClient(client, fmt.Sprintf("reset-client;%s;%d;%d", net.JoinHostPort(e.resetVIP, "80"), resetConns, resetCap), pw, &errb)
	if err != nil {
		return resetResult{err: err}
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	go func() { _ = cmd.Wait(); pw.Close() }()
	lines := bufio.NewScanner(pr)
	if !lines.Scan() || lines.Text() != "ready" {
		return resetResult{err: fmt.Errorf("client: %q: %s", lines.Text(), strings.TrimSpace(errb.String()))}
	}
	// The server vanishes, then leaves the Service.
	if err := netnsutil.Do(b.path, func() error {
		l, err := netlink.LinkByName("p-rserver")
		if err == nil {
			err = netlink.LinkSetDown(l)
		}
		return err
	}); err != nil {
		return resetResult{err: fmt.Errorf("cutting the server off: %w", err)}
	}
	t0 := time.Now()
	if err := eps.Delete(ctx, resetSvc+"-bench", metav1.DeleteOptions{}); err != nil {
		return resetResult{err: fmt.Errorf("deleting %s's EndpointSlice: %w", resetSvc, err)}
	}
	var r resetResult
	for lines.Scan() {
		f := strings.Fields(lines.Text())
		if len(f) != 2 {
			return resetResult{err: fmt.Errorf("client printed %q", lines.Text())}
		}
		if f[0] != "reset" {
			continue // still waiting at the cap, or another error
		}
		ns, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return resetResult{err: fmt.Errorf("client printed %q", lines.Text())}
		}
		r.times = append(r.times, time.Unix(0, ns).Sub(t0))
	}
	return r
}

// resetServerMain is the reset server: it accepts connections and keeps
// them, sending nothing, until killed.
func resetServerMain() int {
	ln, err := net.Listen("tcp4", fmt.Sprintf(":%d", resetPort))
	if err != nil {
		fmt.Fprintln(os.Stderr, "server:", err)
		return 1
	}
	fmt.Println("listening")
	for {
		c, err := ln.Accept()
		if err != nil {
			return 1
		}
		go func() { _, _ = io.Copy(io.Discard, c) }()
	}
}

// resetClientMain is the reset client: spec is "reset-client;ADDR;N;CAP".
// It connects N times to ADDR (retrying while the proxy programs it),
// prints "ready", then waits on every connection for data, at most CAP
// (nanoseconds) longer than the first wait; for each it prints how the
// wait ended: "reset <unix nanoseconds>" for ECONNRESET, else "other
// <error>".
func resetClientMain(spec string) int {
	f := strings.Split(spec, ";")
	n, err := strconv.Atoi(f[2])
	capNs, err2 := strconv.ParseInt(f[3], 10, 64)
	if len(f) != 4 || errors.Join(err, err2) != nil {
		fmt.Fprintln(os.Stderr, "bad client spec", spec)
		return 2
	}
	var conns []net.Conn
	for deadline := time.Now().Add(10 * time.Second); len(conns) < n; {
		c, err := net.DialTimeout("tcp", f[1], time.Second)
		if err != nil {
			if time.Now().After(deadline) {
				fmt.Fprintln(os.Stderr, "client:", err)
				return 1
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		conns = append(conns, c)
	}
	fmt.Println("ready")
	until := time.Now().Add(time.Duration(capNs))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			_ = c.SetReadDeadline(until)
			_, err := c.Read(make([]byte, 1))
			at := time.Now()
			mu.Lock()
			defer mu.Unlock()
			if errors.Is(err, syscall.ECONNRESET) {
				fmt.Println("reset", at.UnixNano())
			} else {
				fmt.Println("other", strings.ReplaceAll(fmt.Sprint(err), " ", "_"))
			}
		})
	}
	wg.Wait()
	return 0
}

// quantile is the q-quantile of ds (nearest rank).
func quantile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}
