// Package pmtu measures how large a packet a path carries: UDP datagrams
// with DF set, whose IP packets are exactly a given size, sent to a
// responder that answers each with its first line only (Serve, or the lab
// workload's UDP echo), so that one direction of the path is measured and
// the answer is small. A size that gets no answer is lost on the way (or
// refused at once with EMSGSIZE when the sender's route already knows a
// smaller MTU).
package pmtu

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Prefix begins every probe.
const Prefix = "size-probe "

// Min is the smallest size Largest tries: IPv4's minimum MTU, which every
// link carries and every pod MTU weft derives exceeds.
const Min = 576

// Conn is a UDP socket to one address that sets DF on every datagram.
type Conn struct {
	conn net.Conn
	v6   bool
	seq  int
	// Tries is how many datagrams Fits sends before it gives up on a size
	// (default 3), and Wait how long each waits for its answer (default
	// 300 ms).
	Tries int
	Wait  time.Duration
}

// New takes over conn, a connected UDP socket, and sets DF on it.
func New(conn net.Conn) (*Conn, error) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return nil, fmt.Errorf("%T has no socket to set DF on", conn)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil, err
	}
	ua, _ := conn.RemoteAddr().(*net.UDPAddr)
	v6 := ua != nil && ua.IP.To4() == nil
	var serr error
	err = raw.Control(func(fd uintptr) {
		if v6 {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO)
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
		}
	})
	if err = errors.Join(err, serr); err != nil {
		return nil, fmt.Errorf("setting DF: %w", err)
	}
	return &Conn{conn: conn, v6: v6, Tries: 3, Wait: 300 * time.Millisecond}, nil
}

// Close closes the socket.
func (c *Conn) Close() error { return c.conn.Close() }

// Send sends one probe whose IP packet is size bytes and returns the answer
// that carries its first line; an error if none came within wait.
func (c *Conn) Send(size int, wait time.Duration) (string, error) {
	hdr := 28 // IPv4 and UDP headers
	if c.v6 {
		hdr = 48
	}
	c.seq++
	token := fmt.Sprintf("%s%d %d", Prefix, c.seq, size)
	if size < hdr+len(token)+1 {
		return "", fmt.Errorf("size %d is below the headers", size)
	}
	payload := []byte(token + "\n" + strings.Repeat("x", size-hdr-len(token)-1))
	if _, err := c.conn.Write(payload); err != nil {
		return "", err
	}
	buf := make([]byte, 2048)
	_ = c.conn.SetReadDeadline(time.Now().Add(wait))
	for {
		n, err := c.conn.Read(buf)
		if err != nil {
			return "", fmt.Errorf("no answer to %d bytes: %w", size, err)
		}
		// An answer to an earlier, late probe is skipped.
		if bytes.Contains(buf[:n], []byte(token)) {
			return string(buf[:n]), nil
		}
	}
}

// Fits reports whether a probe of size gets an answer (Tries probes, Wait
// each).
func (c *Conn) Fits(size int) bool {
	for range max(c.Tries, 1) {
		if _, err := c.Send(size, c.Wait); err == nil {
			return true
		}
	}
	return false
}

// Largest is the largest size in [low, high) that fits, by bisection; 0
// when low does not.
func (c *Conn) Largest(low, high int) int {
	if !c.Fits(low) {
		return 0
	}
	for high-low > 1 {
		mid := (low + high) / 2
		if c.Fits(mid) {
			low = mid
		} else {
			high = mid
		}
	}
	return low
}

// Answer is a responder's answer to a datagram: its first line if it is a
// probe, else nil (not answered).
func Answer(datagram []byte) []byte {
	if !bytes.HasPrefix(datagram, []byte(Prefix)) {
		return nil
	}
	if i := bytes.IndexByte(datagram, '\n'); i >= 0 {
		return datagram[:i]
	}
	return datagram
}

// Serve answers probes on pc until it is closed.
func Serve(pc net.PacketConn) error {
	buf := make([]byte, 65536)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		if a := Answer(buf[:n]); a != nil {
			_, _ = pc.WriteTo(a, from)
		}
	}
}
