package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/weftnet/weft/internal/netnsutil"
)

// The correctness check before any number: every backend runs an echo
// server (this program, roleEnv=echo) that answers a datagram with its
// name; the generator's namespace sends datagrams to the NodePort from
// fresh sockets (other source ports, so other flows) until every backend
// has answered, local and remote, through the proxy's translation both
// ways. A proxy that has not programmed the Service yet gets more tries
// until the deadline.

// echoMain is the echo server: answer every datagram with "backend NAME".
func echoMain() int {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{Port: targetPort})
	if err != nil {
		fmt.Fprintln(os.Stderr, "echo:", err)
		return 1
	}
	fmt.Println("listening")
	reply := []byte("backend " + os.Getenv("PKTBENCH_NAME"))
	buf := make([]byte, 2048)
	for {
		_, from, err := c.ReadFromUDP(buf)
		if err != nil {
			continue
		}
		_, _ = c.WriteToUDP(reply, from)
	}
}

// startEchoes starts an echo server in every pod; stop ends them.
func startEchoes(pods []pod) (stop func(), err error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var cmds []*exec.Cmd
	stop = func() {
		for _, c := range cmds {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}
	for _, p := range pods {
		cmd := exec.Command(self)
		cmd.Env = []string{roleEnv + "=echo", "PKTBENCH_NAME=" + p.name}
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			stop()
			return nil, err
		}
		if err := netnsutil.Do(p.path, cmd.Start); err != nil {
			stop()
			return nil, fmt.Errorf("starting the echo server of %s: %w", p.name, err)
		}
		cmds = append(cmds, cmd)
		line := make([]byte, 16)
		if n, err := out.Read(line); err != nil || !strings.HasPrefix(string(line[:n]), "listening") {
			stop()
			return nil, fmt.Errorf("the echo server of %s did not start: %q %v", p.name, line[:n], err)
		}
	}
	return stop, nil
}

// probe sends rounds of datagrams from the generator's namespace (gen)
// to dsts (the NodePort, or every pod for the routing reference) until
// every pod has answered or the deadline passes;
// alive is checked between rounds (the proxy must still run). It returns
// how many answers each backend gave.
func probe(ctx context.Context, gen string, pods []pod, dsts []*net.UDPAddr, deadline time.Time, alive func() error) (map[string]int, error) {
	seen := map[string]int{}
	missing := func() []string {
		var m []string
		for _, p := range pods {
			if seen[p.name] == 0 {
				m = append(m, p.name)
			}
		}
		return m
	}
	for len(missing()) > 0 {
		if err := alive(); err != nil {
			return seen, err
		}
		if time.Now().After(deadline) {
			return seen, fmt.Errorf("no answer through %v from %s by the deadline (answers so far: %v)", dsts, strings.Join(missing(), ", "), seen)
		}
		if err := probeRound(gen, dsts, 16, seen); err != nil {
			return seen, err
		}
		if ctx.Err() != nil {
			return seen, ctx.Err()
		}
	}
	return seen, nil
}

// probeRound sends one datagram from each of n new sockets (socket k to
// dsts[k mod len]) and collects the answers after 200 ms; an answer must
// come from the address its datagram went to.
func probeRound(gen string, dsts []*net.UDPAddr, n int, seen map[string]int) error {
	var conns []*net.UDPConn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	err := netnsutil.Do(gen, func() error {
		for range n {
			c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: genUplinkIP.AsSlice()})
			if err != nil {
				return err
			}
			conns = append(conns, c)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for k, c := range conns {
		if _, err := c.WriteToUDP([]byte("probe"), dsts[k%len(dsts)]); err != nil {
			return fmt.Errorf("probe: %w", err)
		}
	}
	// The answers have come by then; each socket's queue is read with a
	// deadline of its own (a passed deadline fails a read even with data
	// queued).
	time.Sleep(200 * time.Millisecond)
	buf := make([]byte, 256)
	for k, c := range conns {
		dst := dsts[k%len(dsts)]
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Millisecond))
		for {
			n, from, err := c.ReadFromUDP(buf)
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					break
				}
				continue // an ICMP error while the rules are not there yet
			}
			if !from.IP.Equal(dst.IP) || from.Port != dst.Port {
				return fmt.Errorf("an answer from %v to a datagram for %v (the reply was not translated back)", from, dst)
			}
			if name, ok := strings.CutPrefix(string(buf[:n]), "backend "); ok {
				seen[name]++
			}
		}
	}
	return nil
}

// seenBoth reports whether a local and a remote backend answered.
func seenBoth(pods []pod, seen map[string]int) bool {
	return slices.ContainsFunc(pods, func(p pod) bool { return p.local && seen[p.name] > 0 }) &&
		slices.ContainsFunc(pods, func(p pod) bool { return !p.local && seen[p.name] > 0 })
}
