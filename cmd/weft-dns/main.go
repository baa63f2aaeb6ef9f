// Command weft-dns is weft's cluster DNS: the Kubernetes DNS-Based Service
// Discovery records of the cluster zone from informers or a manifest
// directory, and forwarding with a cache for every other name.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	mdns "github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/weftnet/weft/dns"
	"github.com/weftnet/weft/internal/buildinfo"
	"github.com/weftnet/weft/internal/httpserve"
	"github.com/weftnet/weft/kube"
)

type flags struct {
	kubeconfig, manifests, zone, listen, upstream string
	metrics, health, podRecords, resolvConf       string
	ttl                                           uint
	cacheSize                                     int
	cacheMaxTTL, cacheMaxNeg                      time.Duration
	inCluster                                     bool
}

func main() {
	var f flags
	flag.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig: watch Services, EndpointSlices and Pods with informers")
	flag.BoolVar(&f.inCluster, "in-cluster", false, "watch the cluster weft-dns runs in, with its pod's service account (the Deployment in deploy/)")
	flag.StringVar(&f.manifests, "manifests", "", "directory of YAML/JSON Services, EndpointSlices and Pods, reloaded on change")
	flag.StringVar(&f.zone, "zone", "cluster.local", "cluster domain")
	flag.StringVar(&f.listen, "listen", ":53", "address to serve DNS on, UDP and TCP")
	flag.StringVar(&f.upstream, "upstream", "", "comma-separated upstream servers (ip or ip:port) for other names (default: the nameservers of --resolv-conf)")
	flag.StringVar(&f.resolvConf, "resolv-conf", "/etc/resolv.conf", "where the default upstreams are read")
	flag.UintVar(&f.ttl, "ttl", 5, "TTL of cluster records, seconds")
	flag.StringVar(&f.podRecords, "pod-records", "disabled", "a-b-c-d.<ns>.pod.<zone> records: disabled, or verified (only for addresses of existing pods)")
	flag.IntVar(&f.cacheSize, "cache-size", 10000, "forwarded answers kept")
	flag.DurationVar(&f.cacheMaxTTL, "cache-max-ttl", time.Hour, "longest time a forwarded answer is kept")
	flag.DurationVar(&f.cacheMaxNeg, "cache-max-negative-ttl", 5*time.Minute, "longest time a forwarded NXDOMAIN/NODATA is kept")
	flag.StringVar(&f.metrics, "metrics-addr", ":9153", "address for /metrics (empty: off)")
	flag.StringVar(&f.health, "health-addr", ":8080", "address for /healthz (alive) and /readyz (200 after the first full sync) (empty: off)")
	flag.Parse()

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, f, log); err != nil {
		log.Error("weft-dns failed", "err", err)
		os.Exit(1)
	}
}

func upstreams(f flags) ([]string, error) {
	if f.upstream != "" {
		var out []string
		for _, s := range strings.Split(f.upstream, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
		return out, nil
	}
	cc, err := mdns.ClientConfigFromFile(f.resolvConf)
	if err != nil {
		return nil, fmt.Errorf("--upstream not given and %s unreadable: %w", f.resolvConf, err)
	}
	return cc.Servers, nil
}

// run serves until ctx ends.
func run(ctx context.Context, f flags, log *slog.Logger) error {
	if n := btoi(f.kubeconfig != "") + btoi(f.manifests != "") + btoi(f.inCluster); n != 1 {
		return errors.New("give exactly one of --kubeconfig, --in-cluster and --manifests")
	}
	if f.podRecords != "disabled" && f.podRecords != "verified" {
		return fmt.Errorf("--pod-records: %q is not disabled or verified", f.podRecords)
	}
	if f.ttl > 1<<31-1 {
		return fmt.Errorf("--ttl: %d is too large", f.ttl)
	}
	if _, ok := mdns.IsDomainName(f.zone); !ok || strings.Trim(f.zone, ".") == "" {
		return fmt.Errorf("--zone: %q is not a domain name", f.zone)
	}
	ups, err := upstreams(f)
	if err != nil {
		return err
	}
	x := dns.NewIndex(dns.Config{Zone: f.zone, TTL: uint32(f.ttl), PodRecords: f.podRecords == "verified"})
	x.OnError = func(err error) { log.Warn("object skipped", "err", err) }
	var fwd *dns.Forwarder
	if len(ups) > 0 {
		if fwd, err = dns.NewForwarder(ups); err != nil {
			return fmt.Errorf("--upstream: %w", err)
		}
	} else {
		log.Warn("no upstream: names outside the cluster zone get SERVFAIL")
	}
	cache := dns.NewCache(f.cacheSize, f.cacheMaxTTL, f.cacheMaxNeg)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := dns.NewMetrics(reg, x, cache, fwd)
	if fwd != nil {
		fwd.Metrics = m
	}
	srv := dns.NewServer(&dns.Handler{Index: x, Forward: fwd, Cache: cache, Metrics: m}, log)
	if err := srv.Listen(f.listen); err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := httpserve.Serve(ctx, "--metrics-addr", f.metrics, promhttp.HandlerFor(reg, promhttp.HandlerOpts{})); err != nil {
		return err
	}
	if err := httpserve.Serve(ctx, "--health-addr", f.health, health(x)); err != nil {
		return err
	}
	errc := make(chan error, 2)
	if f.manifests != "" {
		go func() { errc <- kube.WatchManifests(ctx, f.manifests, x, log) }()
	} else {
		client, err := kube.NewClient(f.kubeconfig, "weft-dns/"+buildinfo.Version)
		if err != nil {
			return err
		}
		// Ready once both the Service/EndpointSlice and the Pod informers
		// have delivered their initial lists.
		var pending atomic.Int32
		pending.Store(2)
		done := func() {
			if pending.Add(-1) == 0 {
				x.SetSynced()
				log.Info("first full sync applied", "names", x.Len())
			}
		}
		go func() { errc <- kube.WatchServices(ctx, client, syncHook{x, done}) }()
		go func() { errc <- kube.WatchPods(ctx, client, x, done) }()
	}
	if fwd != nil {
		go fwd.Run(ctx)
	}
	go srv.Serve()
	defer srv.Close()
	log.Info("weft-dns serving", "listen", srv.Addr(), "zone", x.Config().Zone, "upstreams", ups, "version", buildinfo.Version)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		return nil
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// syncHook passes Service events to the index and reports the initial sync
// to done instead of marking the index ready by itself.
type syncHook struct {
	*dns.Index
	done func()
}

func (s syncHook) OnSynced() { s.done() }

func health(x *dns.Index) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !x.Synced() {
			http.Error(w, "waiting for the first full sync", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}
