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
// to the NodePort until every pod has answered or the deadline passes;
// alive is checked between rounds (the proxy must still run). It returns
// how many answers each backend gave.
func probe(ctx context.Context, gen string, pods []pod, deadline time.Time, alive func() error) (map[string]int, error) {
	seen := map[string]int{}
	dst := &net.UDPAddr{IP: node1IP.AsSlice(), Port: nodePort}
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
			return seen, fmt.Errorf("no answer through %s:%d from %s by the deadline (answers so far: %v)", node1IP, nodePort, strings.Join(missing(), ", "), seen)
		}
		if err := probeRound(gen, dst, 16, seen); err != nil {
			return seen, err
		}
		if ctx.Err() != nil {
			return seen, ctx.Err()
		}
	}
	return seen, nil
}

// probeRound sends one datagram from each of n new sockets and collects
// the answers for 300 ms.
func probeRound(gen string, dst *net.UDPAddr, n int, seen map[string]int) error {
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
	until := time.Now().Add(300 * time.Millisecond)
	for _, c := range conns {
		if _, err := c.WriteToUDP([]byte("probe"), dst); err != nil {
			return fmt.Errorf("probe: %w", err)
		}
	}
	buf := make([]byte, 256)
	for _, c := range conns {
		_ = c.SetReadDeadline(until)
		for {
			n, from, err := c.ReadFromUDP(buf)
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					break
				}
				continue // an ICMP error while the rules are not there yet
			}
			if !from.IP.Equal(node1IP.AsSlice()) || from.Port != nodePort {
				return fmt.Errorf("an answer from %v, not from the NodePort %s:%d (the reply was not translated back)", from, node1IP, nodePort)
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
