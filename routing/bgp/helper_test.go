package bgp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/fsutil"
	"github.com/weftnet/weft/routing/bgp"
)

// The kernel tests run every BGP speaker in a process of its own, started
// inside a node's (or a router's) network namespace: gobgp opens its
// sockets from goroutines the test cannot pin to a namespace. The process
// is this test binary, told by helperEnv what to be.
const helperEnv = "WEFT_BGP_HELPER"

// helperResyncEnv, if set, is a node helper's controller resync period.
const helperResyncEnv = "WEFT_BGP_HELPER_RESYNC"

// nodeState is what a node helper reads: the API view and the ConfigMap.
type nodeState struct {
	Self         string
	Nodes        []bgp.Node
	Config       string // the ConfigMap's config.yaml
	ClusterCIDRs []netip.Prefix
	Services     []bgp.Service
}

// routerState is what a router helper (a ToR, an external peer) runs: a
// plain speaker that announces Announcements to Neighbors.
type routerState struct {
	Plan bgp.Plan
}

// helperStatus is what a helper writes back when it changes, checked
// every 100 ms. The helper reads its state file at start and when inotify
// says the file's directory changed (as an agent's informer is told): a
// hundred helpers reading theirs ten times a second would take the CPU the
// convergence benchmark measures.
type helperStatus struct {
	Established []netip.Addr
	RIB         []bgp.Candidate // router helpers only
}

// runHelper is the helper's main: it follows its state file until killed.
func runHelper(kind, stateFile, statusFile string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	var last []byte
	fresh := true // the state file may have changed since read last
	read := func() ([]byte, bool) {
		if !fresh {
			return nil, false
		}
		data, err := os.ReadFile(stateFile)
		fresh = err != nil // not there yet: tried again at the next tick
		if err != nil || string(data) == string(last) {
			return nil, false
		}
		last = data
		return data, true
	}
	// The status is written when it changes: a hundred helpers rewriting
	// theirs ten times a second would load the machine the benchmark
	// measures.
	var lastStatus []byte
	writeStatus := func(st helperStatus) {
		slices.SortFunc(st.Established, netip.Addr.Compare)
		data, _ := json.Marshal(st)
		if string(data) == string(lastStatus) {
			return
		}
		if fsutil.WriteFileAtomic(statusFile, data, 0o644) == nil {
			lastStatus = data
		}
	}
	changed, err := watchDir(filepath.Dir(stateFile))
	if err != nil {
		log.Error("helper state", "err", err)
		return 2
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	due := false
	switch kind {
	case "node":
		resync, _ := time.ParseDuration(os.Getenv(helperResyncEnv))
		c := bgp.NewController(bgp.ControllerOptions{Log: log, Resync: resync})
		var (
			config   string
			parsed   bool
			settings bgp.Settings
			pw       map[int]string
		)
		done := make(chan struct{})
		go func() { c.Run(ctx); close(done) }()
		for {
			select {
			case <-done:
				return 0
			case <-changed:
				fresh = true
			case <-tick.C:
				due = true
			}
			if data, ok := read(); ok {
				var s nodeState
				if err := json.Unmarshal(data, &s); err != nil {
					log.Error("helper state", "err", err)
					return 2
				}
				// As an agent does, the configuration is parsed only
				// when it changed.
				if s.Config != config || !parsed {
					st, peerErrs, err := bgp.Parse(map[string]string{bgp.ConfigKey: s.Config})
					if err != nil {
						log.Error("helper config", "err", err)
						return 2
					}
					var pwErrs []error
					pw, pwErrs = bgp.LoadPasswords(st, func(string, string) (string, error) { return "", os.ErrNotExist })
					for _, e := range append(peerErrs, pwErrs...) {
						log.Warn("config", "err", e)
					}
					config, parsed, settings = s.Config, true, st
				}
				c.Update(bgp.Input{Self: s.Self, Nodes: s.Nodes, Settings: settings, Passwords: pw, ClusterCIDRs: s.ClusterCIDRs, Services: s.Services})
			}
			if due {
				writeStatus(helperStatus{Established: c.Established()})
				due = false
			}
		}
	case "router":
		sp := bgp.NewSpeaker(bgp.SpeakerOptions{Log: log})
		// The RIB is listed, installed and reported at the tick after it
		// changed; the session states at every tick.
		ribChanged := true
		var (
			rib     []bgp.Candidate
			lastEst []netip.Addr
		)
		for {
			select {
			case <-ctx.Done():
				sp.Stop(context.Background(), false)
				return 0
			case <-changed:
				fresh = true
			case <-sp.Changes():
				sp.TakeChanges() // the listing below holds them
				ribChanged = true
			case <-tick.C:
				due = true
			}
			if data, ok := read(); ok {
				var s routerState
				if err := json.Unmarshal(data, &s); err != nil {
					log.Error("helper state", "err", err)
					return 2
				}
				if err := sp.Apply(ctx, s.Plan); err != nil {
					log.Error("router plan", "err", err)
				}
			}
			if !due {
				continue
			}
			due = false
			est := sp.Established()
			slices.SortFunc(est, netip.Addr.Compare)
			if !ribChanged && slices.Equal(est, lastEst) {
				continue // the status is as written
			}
			lastEst = est
			if ribChanged {
				ribChanged = false
				var err error
				if rib, err = sp.Candidates(); err != nil {
					log.Error("router rib", "err", err)
				}
				// A router forwards along everything it learns.
				if err := (bgp.FIB{}).Sync(bgp.Select(rib, anything), true); err != nil {
					log.Error("router fib", "err", err)
				}
			}
			writeStatus(helperStatus{Established: est, RIB: rib})
		}
	}

	fmt.Fprintln(os.Stderr, "unknown helper", kind)
	return 2
}

// anything is a router's import policy: every route but a default one.
var anything = bgp.ImportPolicy{Prefixes: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}}

// helperCmd is the command that runs a helper of kind on the files.
func helperCmd(kind, stateFile, statusFile string) *exec.Cmd {
	cmd := exec.Command("/proc/self/exe")
	cmd.Env = append(os.Environ(), helperEnv+"="+kind+","+stateFile+","+statusFile)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// watchDir pokes the returned channel (coalesced) whenever a file is
// written or renamed into dir.
func watchDir(dir string) (<-chan struct{}, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CLOSE_WRITE|unix.IN_MOVED_TO); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("watching %s: %w", dir, err)
	}
	ch := make(chan struct{}, 1)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := unix.Read(fd, buf)
			if err == unix.EINTR {
				continue
			}
			if err != nil || n <= 0 {
				return
			}
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}()
	return ch, nil
}
