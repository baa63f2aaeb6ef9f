package lab

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// TestWaitTurnIsFair: a program that gives the turn back and asks for it
// again at once waits behind one that was already waiting.
func TestWaitTurnIsFair(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // against hangs only
	defer cancel()
	doneA, err := waitTurn(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	gotB, releaseB := make(chan func()), make(chan struct{})
	go func() {
		done, err := waitTurn(ctx, dir)
		if err != nil {
			t.Error(err)
			close(gotB)
			return
		}
		gotB <- done
		<-releaseB
		done()
	}()
	// B is waiting once it holds the queue.
	for !held(t, filepath.Join(dir, queueLock)) {
		if ctx.Err() != nil {
			t.Fatal("the second program never queued")
		}
		time.Sleep(10 * time.Millisecond)
	}
	doneA()
	gotA2 := make(chan func(), 1)
	go func() {
		done, err := waitTurn(ctx, dir)
		if err != nil {
			t.Error(err)
			close(gotA2)
			return
		}
		gotA2 <- done
	}()
	select {
	case <-gotB:
	case done := <-gotA2:
		if done != nil {
			done()
		}
		t.Fatal("the program asking again took the turn before the one already waiting")
	}
	select {
	case <-gotA2:
		t.Fatal("two programs hold the turn")
	default:
	}
	close(releaseB)
	if done := <-gotA2; done != nil {
		done()
	}
}

// held reports whether another open file holds the flock of path.
func held(t *testing.T, path string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	f, err := lock(ctx, path)
	if err != nil {
		return true
	}
	f.Close()
	return false
}
