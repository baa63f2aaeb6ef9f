package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// turnLock is the machine-wide lock of programs that bring labs up and
// down by themselves (tests, benchmarks): a machine holds one lab at a
// time (its namespace names and API port are fixed). queueLock orders
// the programs waiting for it: the one that holds the queue is the next
// to take the turn, so a program that gives the turn back and asks again
// at once (a test binary running lab tests one after another) waits
// behind one that was already waiting (make test's VM suites, which
// otherwise lost every race for 30 minutes).
const (
	lockDir   = "/run/lock"
	turnLock  = "weft-lab.lock"
	queueLock = "weft-lab.queue"
)

// WaitTurn waits until no other program holding a turn runs a lab, and
// takes the turn; done gives it back (after Down). `weftctl lab up` takes
// no turn: it refuses to start while any lab runs.
func WaitTurn(ctx context.Context) (done func(), err error) { return waitTurn(ctx, lockDir) }

func waitTurn(ctx context.Context, dir string) (done func(), err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	q, err := lock(ctx, filepath.Join(dir, queueLock))
	if err != nil {
		return nil, err
	}
	defer q.Close() // the next waiter's turn to queue, once this one holds the lab
	t, err := lock(ctx, filepath.Join(dir, turnLock))
	if err != nil {
		return nil, err
	}
	return func() { t.Close() }, nil
}

// lock takes an exclusive flock on path, polling until ctx ends.
func lock(ctx context.Context, path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for another program's lab to go (%s): %w", path, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
