// Package benchlab is what the lab benchmarks (proxybench, dnsbench) share:
// running in a private network namespace, a one-node lab whose own agent
// is paused, an API client and kubeconfig for the measured processes, and
// parallel seeding of API objects.
package benchlab

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/lab"
)

// Main runs body in a private network and mount namespace
// (netnsutil.Isolate), with a context that SIGINT and SIGTERM cancel: the
// parent passes the signals on to the isolated child, which can then remove
// its lab. An error is printed after prog's name and exits 1.
func Main(prog string, body func(ctx context.Context) error) {
	if !netnsutil.Isolated() {
		forwardSignals()
	}
	code, reexeced, err := netnsutil.Isolate()
	if err == nil && reexeced {
		os.Exit(code)
	}
	if err == nil {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err = body(ctx)
		stop()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", prog, err)
		os.Exit(1)
	}
}

// forwardSignals passes SIGINT/SIGTERM received by this process (the
// parent of Isolate) on to its children.
func forwardSignals() {
	ch := make(chan os.Signal, 4)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		for sig := range ch {
			tasks, _ := filepath.Glob("/proc/self/task/*/children")
			for _, t := range tasks {
				b, _ := os.ReadFile(t)
				for _, f := range strings.Fields(string(b)) {
					if pid, err := strconv.Atoi(f); err == nil {
						_ = syscall.Kill(pid, sig.(syscall.Signal))
					}
				}
			}
		}
	}()
}

// Lab is a one-node lab whose weft-agent is gone once the node is set up
// (its DaemonSet selects no node any more), so that its own proxy neither
// programs the benchmark's Services nor takes CPU from the process
// measured; what it programmed (routes, bridge, CNI configuration) stays.
type Lab struct {
	Dir string
	// Kubeconfig is the admin's, addressing the API server over the
	// underlay: usable by processes in the node's namespace.
	Kubeconfig string
	// Client talks to the API server from this process (QPS 500).
	Client kubernetes.Interface
	// Config is Client's configuration, for clients of other settings
	// (SeedClient).
	Config *rest.Config
	Node   lab.Member
	done   func() // gives the machine's lab turn back
}

// Up checks that binDir holds need (besides the lab's own binaries) and
// starts the lab in a new directory. Call Down when done, also after an
// error.
func Up(ctx context.Context, prog, binDir string, need ...string) (*Lab, error) {
	for _, b := range append(need, "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "weftctl", "weft-agent", lab.ImageArchive) {
		if _, err := os.Stat(filepath.Join(binDir, b)); err != nil {
			return nil, fmt.Errorf("%w (run `make build kube image` first)", err)
		}
	}
	done, err := lab.WaitTurn(ctx)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", prog)
	if err != nil {
		done()
		return nil, err
	}
	l := &Lab{Dir: dir, done: done}
	if err := lab.Up(ctx, lab.Options{Nodes: 1, Routing: "hostgw", Dir: dir, BinDir: binDir, APIPort: lab.APIServerPort, Out: os.Stdout}); err != nil {
		return l, err
	}
	l.Kubeconfig = filepath.Join(dir, "bench.kubeconfig")
	admin, err := os.ReadFile(lab.AdminKubeconfig(dir))
	if err != nil {
		return l, err
	}
	inLab := fmt.Sprintf("https://%s:%d", lab.ControlIP, lab.APIServerPort)
	if err := os.WriteFile(l.Kubeconfig, []byte(strings.Replace(string(admin), fmt.Sprintf("https://127.0.0.1:%d", lab.APIServerPort), inLab, 1)), 0o600); err != nil {
		return l, err
	}
	cfg, err := lab.RESTConfig(lab.AdminKubeconfig(dir))
	if err != nil {
		return l, err
	}
	cfg.QPS, cfg.Burst = 500, 1000
	l.Config = rest.CopyConfig(cfg)
	if l.Client, err = kubernetes.NewForConfig(cfg); err != nil {
		return l, err
	}
	st, err := lab.Load(dir)
	if err != nil {
		return l, err
	}
	for _, m := range lab.NodeMembers(st.Members) {
		l.Node = m
	}
	return l, l.stopAgent(ctx, st)
}

// stopAgent takes weft-agent off the node and waits until it stopped.
func (l *Lab) stopAgent(ctx context.Context, st *lab.State) error {
	patch := `{"spec":{"template":{"spec":{"nodeSelector":{"weft.dev/benchmark":"no-agent"}}}}}`
	if _, err := lab.Kubectl(ctx, st, "-n", "weft-system", "patch", "daemonset", "weft-agent", "-p", patch); err != nil {
		return err
	}
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if _, ok := lab.PID(l.Dir, l.Node.Name+"-agent"); !ok {
			return nil
		}
	}
	return fmt.Errorf("weft-agent still runs on %s after 60s", l.Node.Name)
}

// Down removes the lab.
func (l *Lab) Down() error {
	if l == nil {
		return nil
	}
	defer l.done()
	return lab.Down(l.Dir)
}

// EnsureNamespace creates namespace ns unless it exists.
func EnsureNamespace(ctx context.Context, c kubernetes.Interface, ns string) error {
	_, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return lab.WaitServiceAccount(ctx, c, ns)
}

// SeedClient is a client for seeding many objects: protobuf on the wire
// (what the controllers and the proxies' informers use; cheaper for the API
// server to decode and encode than JSON) and no client-side rate limit, so
// that the API server and etcd, not the client, set the pace.
func (l *Lab) SeedClient() (kubernetes.Interface, error) {
	cfg := rest.CopyConfig(l.Config)
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.QPS, cfg.Burst = -1, 0 // no client-side limiter
	return kubernetes.NewForConfig(cfg)
}

// Workers is how many objects Parallel creates at a time.
const Workers = 32

// Parallel calls create(i) for i in [from, to) from Workers goroutines and
// returns the first error (or ctx's).
func Parallel(ctx context.Context, from, to int, create func(i int) error) error {
	return ParallelN(ctx, Workers, from, to, create)
}

// ParallelN is Parallel with workers goroutines.
func ParallelN(ctx context.Context, workers, from, to int, create func(i int) error) error {
	var next atomic.Int64
	next.Store(int64(from))
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= to {
					return
				}
				if err := create(i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	return ctx.Err()
}
