package routing_test

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/weftnet/weft/internal/netnsutil"
)

// podAddr is pod i's address of the family of v6.
func podAddr(i int, v6 bool) netip.Addr {
	if v6 {
		return host(podCIDR6(i), 2)
	}
	return host(podCIDR4(i), 2)
}

// serve starts, in every pod, a TCP server on both families that answers
// each line with "pod-<i> saw <client address>", connection kept open.
func (l *lab) serve() {
	l.t.Helper()
	for _, nd := range l.nodes {
		var ln net.Listener
		l.do(nd.pod, func() (err error) { ln, err = net.Listen("tcp", fmt.Sprintf(":%d", podPort)); return err })
		l.t.Cleanup(func() { ln.Close() })
		name := fmt.Sprintf("pod-%d", nd.i)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go answer(c, name)
			}
		}()
	}
}

func answer(c net.Conn, name string) {
	defer c.Close()
	r := bufio.NewReader(c)
	for {
		if _, err := r.ReadString('\n'); err != nil {
			return
		}
		host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
		if _, err := fmt.Fprintf(c, "%s saw %s\n", name, host); err != nil {
			return
		}
	}
}

// conn is a TCP connection from one pod to another's server.
type conn struct {
	c net.Conn
	r *bufio.Reader
}

// dial connects pod from to pod to over the family of v6.
func (l *lab) dial(from, to int, v6 bool, timeout time.Duration) (*conn, error) {
	dst := netip.AddrPortFrom(podAddr(to, v6), podPort).String()
	var c net.Conn
	err := netnsutil.Do(l.node(from).pod, func() (err error) {
		c, err = net.DialTimeout("tcp", dst, timeout)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dialing %s from pod-%d: %w", dst, from, err)
	}
	l.t.Cleanup(func() { c.Close() })
	return &conn{c: c, r: bufio.NewReader(c)}, nil
}

// say sends a line and returns the answer.
func (c *conn) say(timeout time.Duration) (string, error) {
	_ = c.c.SetDeadline(time.Now().Add(timeout))
	if _, err := fmt.Fprintln(c.c, "hello"); err != nil {
		return "", err
	}
	line, err := c.r.ReadString('\n')
	return strings.TrimSpace(line), err
}

// exchange makes one TCP exchange pod from -> pod to; the server must see
// pod from's own address (no NAT on the way).
func (l *lab) exchange(from, to int, v6 bool) error {
	c, err := l.dial(from, to, v6, 3*time.Second)
	if err != nil {
		return err
	}
	defer c.c.Close()
	got, err := c.say(3 * time.Second)
	if err != nil {
		return fmt.Errorf("pod-%d -> pod-%d: %w", from, to, err)
	}
	if want := fmt.Sprintf("pod-%d saw %s", to, podAddr(from, v6)); got != want {
		return fmt.Errorf("pod-%d -> pod-%d: answer %q, want %q", from, to, got, want)
	}
	return nil
}

// mustReach asserts TCP exchanges pod from -> each pod to, on both families.
func (l *lab) mustReach(from int, to ...int) {
	l.t.Helper()
	for _, dst := range to {
		for _, v6 := range []bool{false, true} {
			if err := l.exchange(from, dst, v6); err != nil {
				l.t.Fatalf("TCP exchange: %v", err)
			}
		}
	}
}

// mustNotReach asserts that pod from cannot connect to pod to on either
// family. Without a route the node answers "unreachable" at once; the short
// timeout only bounds the wait for a black hole.
func (l *lab) mustNotReach(from int, to ...int) {
	l.t.Helper()
	for _, dst := range to {
		for _, v6 := range []bool{false, true} {
			if c, err := l.dial(from, dst, v6, 500*time.Millisecond); err == nil {
				c.c.Close()
				l.t.Fatalf("pod-%d reached pod-%d (%s)", from, dst, podAddr(dst, v6))
			}
		}
	}
}

// mustSay asserts that c, a long-lived connection pod from -> pod to over
// the family of v6, still carries bytes both ways.
func (l *lab) mustSay(c *conn, from, to int, v6 bool, when string) {
	l.t.Helper()
	got, err := c.say(5 * time.Second)
	if want := fmt.Sprintf("pod-%d saw %s", to, podAddr(from, v6)); err != nil || got != want {
		l.t.Fatalf("long-lived connection %s: got %q (%v), want %q", when, got, err, want)
	}
}
