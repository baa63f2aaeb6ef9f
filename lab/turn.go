package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// turnLock is the machine-wide lock of programs that bring labs up and
// down by themselves (tests, benchmarks): a machine holds one lab at a
// time (its namespace names and API port are fixed).
const turnLock = "/run/lock/weft-lab.lock"

// WaitTurn waits until no other program holding a turn runs a lab, and
// takes the turn; done gives it back (after Down). `weftctl lab up` takes
// no turn: it refuses to start while any lab runs.
func WaitTurn(ctx context.Context) (done func(), err error) {
	if err := os.MkdirAll("/run/lock", 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(turnLock, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", turnLock, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for another program's lab to go (%s): %w", turnLock, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
