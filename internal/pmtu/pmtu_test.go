package pmtu

import (
	"errors"
	"net"
	"testing"
	"time"
)

func TestAnswer(t *testing.T) {
	for in, want := range map[string]string{
		Prefix + "1 1400\nxxxx": Prefix + "1 1400",
		Prefix + "no newline":   Prefix + "no newline",
		"hello\n":               "",
	} {
		if got := string(Answer([]byte(in))); got != want {
			t.Errorf("Answer(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestLargest probes a loopback responder that answers only datagrams
// whose IP packets are at most limit bytes, as a path of that MTU would.
func TestLargest(t *testing.T) {
	const limit = 1000
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	go func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := pc.ReadFrom(buf)
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if a := Answer(buf[:n]); a != nil && n+28 <= limit {
				_, _ = pc.WriteTo(a, from)
			}
		}
	}()
	conn, err := net.Dial("udp4", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(conn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Tries, c.Wait = 2, 100*time.Millisecond
	if !c.Fits(Min) || c.Fits(limit+1) {
		t.Fatalf("Fits(%d) and Fits(%d): want true, false", Min, limit+1)
	}
	if got := c.Largest(Min, 1500); got != limit {
		t.Fatalf("Largest = %d, want %d", got, limit)
	}
}
