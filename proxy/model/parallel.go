package model

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// parallelMin is the number of items per goroutine below which Parallel
// does not start one more: a Snapshot of a few changes stays in the
// caller.
const parallelMin = 256

// Parallel calls f(i) for every i in [0, n), spread over up to GOMAXPROCS
// goroutines when n is large (a first Snapshot of a big cluster, a
// backend's first render of it), else in the caller. f must be safe to
// call concurrently for different i.
func Parallel(n int, f func(int)) {
	workers := min(runtime.GOMAXPROCS(0), n/parallelMin)
	if workers <= 1 {
		for i := range n {
			f(i)
		}
		return
	}
	const chunk = 64
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				from := int(next.Add(chunk)) - chunk
				if from >= n {
					return
				}
				for i := from; i < min(from+chunk, n); i++ {
					f(i)
				}
			}
		})
	}
	wg.Wait()
}
