package netpoltest

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/policy/oracle"
)

// Target is where a pod of the bed lives: its network namespace and address.
type Target struct {
	NSPath string
	IP     string
}

// ProbeTimeout bounds one probe: a denied connection is one that got no
// answer within it. Callers compare whole grids with retries (WaitMatch), so
// a slow allowed probe costs a retry, never a wrong verdict.
var ProbeTimeout = 300 * time.Millisecond

// Probe measures the cells of like (its pods, ports and protocols) with real
// packets: a TCP connection that is accepted, a UDP datagram that is
// echoed back, or an SCTP association that is established, from the
// source pod's namespace to the destination pod.
func Probe(ctx context.Context, pods map[string]Target, like oracle.Matrix) oracle.Matrix {
	return probe(ctx, pods, like, nil)
}

// probe measures like's cells; a cell that want expects allowed gets up to
// allowedAttempts tries (a loaded machine may miss one ProbeTimeout, but a
// denied flow never connects, so retrying cannot turn a deny into an allow
// wrongly).
func probe(ctx context.Context, pods map[string]Target, like oracle.Matrix, want *oracle.Matrix) oracle.Matrix {
	got := oracle.NewMatrix(like.Pods, like.Ports, like.Protos)
	var mu sync.Mutex
	work := make(chan oracle.Case)
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range work {
				tries := 1
				if want != nil && want.Cells[c] {
					tries = allowedAttempts
				}
				ok := false
				for range tries {
					if ok = probeOne(ctx, pods[c.From], pods[c.To], c); ok {
						break
					}
				}
				mu.Lock()
				got.Cells[c] = ok
				mu.Unlock()
			}
		}()
	}
	for _, c := range like.Cases() {
		work <- c
	}
	close(work)
	wg.Wait()
	return got
}

func probeOne(ctx context.Context, from, to Target, c oracle.Case) bool {
	ctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
	defer cancel()
	if c.Proto == corev1.ProtocolSCTP {
		return probeSCTP(ctx, from, to, c.Port)
	}
	addr := net.JoinHostPort(to.IP, strconv.Itoa(int(c.Port)))
	network := strings.ToLower(string(c.Proto))
	conn, err := netnsutil.Dialer(from.NSPath, nil)(ctx, network, addr)
	if err != nil {
		return false
	}
	defer conn.Close()
	if network == "tcp" {
		return true // the handshake completed
	}
	dl, _ := ctx.Deadline()
	_ = conn.SetDeadline(dl)
	if _, err := conn.Write([]byte("probe\n")); err != nil {
		return false
	}
	buf := make([]byte, 512)
	n, err := conn.Read(buf)
	return err == nil && n > 0
}

const allowedAttempts = 3

// WaitMatch probes until the measured grid equals want or the deadline
// passes, and returns the last measurement.
func WaitMatch(deadline time.Time, pods map[string]Target, want oracle.Matrix) (oracle.Matrix, error) {
	for {
		got := probe(context.Background(), pods, want, &want)
		if len(want.Diff(got)) == 0 {
			return got, nil
		}
		if time.Now().After(deadline) {
			return got, errors.New("measured reachability does not match the oracle")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
