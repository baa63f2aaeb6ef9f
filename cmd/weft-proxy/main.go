// Command weft-proxy is weft's service proxy on its own: a drop-in for
// kube-proxy, or a way to try weft's rules from a directory of manifests.
// weft-agent runs the same proxy on every node.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/weftnet/weft/internal/buildinfo"
	"github.com/weftnet/weft/internal/cliflag"
	"github.com/weftnet/weft/internal/httpserve"
	"github.com/weftnet/weft/kube"
	"github.com/weftnet/weft/proxy"
	"github.com/weftnet/weft/proxy/ebpf"
	"github.com/weftnet/weft/proxy/iptables"
	"github.com/weftnet/weft/proxy/ipvs"
	"github.com/weftnet/weft/proxy/model"
	"github.com/weftnet/weft/proxy/nftables"
	"github.com/weftnet/weft/proxy/userspace"
)

type flags struct {
	kubeconfig, manifests, mode, node, zone, variant string
	healthz, metrics, cgroupRoot, bpfPinPath         string
	ipvsScheduler                                    string
	usListen, usGlue, usPorts                        string
	usMaxConns, usMaxUDP                             int
	usUDPTimeout, usDialTimeout                      time.Duration
	nodeIPs                                          cliflag.Addrs
	clusterCIDRs, nodePortAddrs                      cliflag.Prefixes
	bpfDevices                                       cliflag.Names
	bpfCTMax, bpfLBMax                               int
	bpfLBMode, bpfXDP                                string
	masqAll, dryRun, cleanup, dump                   bool
	masqBit                                          int
	minSync, sync                                    time.Duration
}

func main() {
	var f flags
	flag.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig: watch Services and EndpointSlices with informers")
	flag.StringVar(&f.manifests, "manifests", "", "directory of YAML/JSON Services and EndpointSlices, reloaded on change")
	flag.StringVar(&f.mode, "mode", "iptables", "proxy backend: iptables, nftables, ipvs, ebpf or userspace")
	flag.StringVar(&f.node, "node-name", os.Getenv("NODE_NAME"), "this node's name (for Local traffic policies)")
	flag.StringVar(&f.zone, "zone", "", "this node's zone (topology hints)")
	flag.Var(&f.nodeIPs, "node-ip", "this node's address (repeatable); NodePorts answer on it")
	flag.Var(&f.clusterCIDRs, "cluster-cidr", "pod CIDR (repeatable): ClusterIP traffic from outside it is masqueraded")
	flag.Var(&f.nodePortAddrs, "nodeport-addresses", "CIDRs (repeatable) selecting the node IPs NodePorts answer on (default: every --node-ip)")
	flag.BoolVar(&f.masqAll, "masquerade-all", false, "masquerade all traffic to ClusterIPs")
	flag.IntVar(&f.masqBit, "masquerade-bit", 14, "fwmark bit marking traffic to masquerade (the next bit marks drops)")
	flag.StringVar(&f.ipvsScheduler, "ipvs-scheduler", "", "ipvs mode: the scheduler of every virtual server: rr, wrr, lc, sh, mh, ... (default rr)")
	flag.StringVar(&f.variant, "iptables", "", "iptables variant: nft, legacy, or empty for the system default")
	flag.StringVar(&f.cgroupRoot, "cgroup-root", "", "ebpf mode: cgroup v2 directory the socket programs attach to (default: the cgroup v2 mount)")
	flag.StringVar(&f.bpfPinPath, "bpf-pin-path", ebpf.DefaultPinPath, "ebpf mode: bpffs directory for weft's pinned maps and links")
	flag.StringVar(&f.bpfLBMode, "bpf-lb-mode", ebpf.LBModeSNAT, "ebpf mode: external traffic (eTP Cluster) to a backend of another node: snat (the node masquerades it, replies come back through it), dsr (IPv4: the backend's node answers the client directly, the backend sees the client's address; UDP needs 8 bytes of MTU headroom), hybrid (dsr for TCP, snat for UDP)")
	flag.StringVar(&f.bpfXDP, "bpf-xdp", ebpf.XDPOff, "ebpf mode: translate external traffic (NodePorts, externalIPs, LoadBalancer IPs) at the XDP hook of the uplinks, ahead of tc: off, auto (native where the driver supports it, tc elsewhere), native (a device without native XDP is an error), generic (the kernel's generic XDP, on any device)")
	flag.Var(&f.bpfDevices, "bpf-devices", "ebpf mode: uplinks for traffic from outside the node, repeatable or comma-separated (default: the links holding the node IPs)")
	flag.IntVar(&f.bpfCTMax, "bpf-ct-max", 0, "ebpf mode: entries of each conntrack map of the traffic from outside and of each flow map of the socket programs (0: a quarter percent of the node's memory, at least 65536)")
	flag.IntVar(&f.bpfLBMax, "bpf-lb-map-max", 0, "ebpf mode: entries of the services map (frontends and their backend slots); the backends, affinity members and source ranges maps get half of it, the Maglev map a 64th (0: one per 4 KiB of the node's memory, 524288 to 4194304); a sync whose Services do not fit fails and writes nothing")
	flag.StringVar(&f.usListen, "userspace-listen", "", "userspace mode, rootless: listen on this address (e.g. 127.0.0.1), one port per service port, no kernel rules; the map is /services on --metrics-addr")
	flag.StringVar(&f.usGlue, "userspace-glue", "", "userspace mode without --userspace-listen: iptables or nftables REDIRECT glue (default: iptables when iptables-restore is installed, else nftables)")
	flag.StringVar(&f.usPorts, "userspace-port-range", userspace.DefaultPortRange.String(), "userspace mode: the ports listeners take (after the service's own port, rootless)")
	flag.IntVar(&f.usMaxConns, "userspace-max-connections", 4096, "userspace mode: concurrent proxied TCP connections at most (new ones are reset)")
	flag.IntVar(&f.usMaxUDP, "userspace-max-udp-sessions", 4096, "userspace mode: concurrent UDP sessions at most (new clients' datagrams are dropped)")
	flag.DurationVar(&f.usUDPTimeout, "userspace-udp-timeout", 10*time.Second, "userspace mode: a UDP session ends after this long without a datagram either way")
	flag.DurationVar(&f.usDialTimeout, "userspace-dial-timeout", time.Second, "userspace mode: an endpoint that does not accept within this is skipped for the next")
	flag.DurationVar(&f.minSync, "min-sync-period", 100*time.Millisecond, "minimum time between syncs")
	flag.DurationVar(&f.sync, "sync-period", time.Hour, "period of full resyncs")
	flag.StringVar(&f.healthz, "healthz-addr", ":10256", "address for /healthz and /livez (empty: off)")
	flag.StringVar(&f.metrics, "metrics-addr", ":10249", "address for /metrics (empty: off)")
	flag.BoolVar(&f.dryRun, "dry-run", false, "print the rules the first sync would apply, and exit")
	flag.BoolVar(&f.cleanup, "cleanup", false, "remove everything weft-proxy installed, and exit")
	flag.BoolVar(&f.dump, "dump", false, "ebpf mode: print the service and backend maps as a table, and exit")
	flag.Parse()

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(f, log); err != nil {
		log.Error("weft-proxy failed", "err", err)
		os.Exit(1)
	}
}

func parseConfig(f flags, log *slog.Logger) (proxy.Config, error) {
	c := proxy.Config{Mode: f.mode, NodeName: f.node, Zone: f.zone, MasqueradeAll: f.masqAll, MasqueradeBit: f.masqBit,
		IPTablesVariant: f.variant, MinSyncPeriod: f.minSync, SyncPeriod: f.sync, HealthCheckPorts: !f.dryRun, Log: log}
	c.NodeIPs, c.ClusterCIDRs, c.NodePortAddresses = f.nodeIPs, f.clusterCIDRs, f.nodePortAddrs
	c.CgroupRoot, c.BPFPinPath, c.BPFDevices, c.BPFCTMax, c.BPFLBMax = f.cgroupRoot, f.bpfPinPath, f.bpfDevices, f.bpfCTMax, f.bpfLBMax
	c.IPVSScheduler = f.ipvsScheduler
	if err := ebpf.CheckLBMode(f.bpfLBMode); err != nil {
		return c, err
	}
	c.BPFLBMode = f.bpfLBMode
	if err := ebpf.CheckXDPMode(f.bpfXDP); err != nil {
		return c, err
	}
	c.BPFXDP = f.bpfXDP
	if f.mode != "userspace" {
		if f.usListen != "" || f.usGlue != "" {
			return c, fmt.Errorf("--userspace-listen and --userspace-glue need --mode userspace")
		}
		return c, nil
	}
	u := userspace.Config{Glue: f.usGlue, MaxConnections: f.usMaxConns, MaxUDPSessions: f.usMaxUDP,
		UDPIdleTimeout: f.usUDPTimeout, DialTimeout: f.usDialTimeout}
	var err error
	if u.PortRange, err = userspace.ParsePortRange(f.usPorts); err != nil {
		return c, fmt.Errorf("--userspace-port-range: %w", err)
	}
	if f.usListen != "" {
		if u.Listen, err = netip.ParseAddr(f.usListen); err != nil {
			return c, fmt.Errorf("--userspace-listen: %w", err)
		}
		if f.usGlue != "" {
			return c, errors.New("--userspace-glue: rootless mode (--userspace-listen) writes no kernel rules")
		}
		c.HealthCheckPorts = false // no node to answer for
	}
	c.Userspace = u
	return c, nil
}

func run(f flags, log *slog.Logger) error {
	cfg, err := parseConfig(f, log)
	if err != nil {
		return err
	}
	if f.dump {
		if f.mode != "ebpf" {
			return fmt.Errorf("--dump: not supported by mode %s", f.mode)
		}
		return ebpf.Dump(f.bpfPinPath, os.Stdout)
	}
	if (f.kubeconfig == "") == (f.manifests == "") && !f.cleanup {
		return errors.New("give exactly one of --kubeconfig and --manifests")
	}
	p, backend, err := proxy.Build(cfg)
	if err != nil {
		return err
	}
	if f.cleanup {
		return p.Cleanup()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if f.dryRun {
		render, err := dryRun(backend)
		if err != nil {
			return fmt.Errorf("--dry-run: %w (mode %s)", err, f.mode)
		}
		dctx, done := context.WithCancel(ctx)
		p = proxy.New(printer{render, done}, proxy.Options{Log: log, NodeName: cfg.NodeName, Zone: cfg.Zone})
		ctx = dctx
	}
	var source func(context.Context) error
	if f.manifests != "" {
		source = func(ctx context.Context) error { return kube.WatchManifests(ctx, f.manifests, p, log) }
	} else {
		client, err := kube.NewClient(f.kubeconfig, "weft-proxy/"+buildinfo.Version)
		if err != nil {
			return err
		}
		source = func(ctx context.Context) error { return kube.WatchServices(ctx, client, p) }
	}
	if !f.dryRun {
		proxy.Prepare(backend, log)
	}
	errc := make(chan error, 1)
	go func() { errc <- source(ctx) }()
	if !f.dryRun {
		if err := httpserve.Serve(ctx, "--healthz-addr", f.healthz, healthHandler(p)); err != nil {
			return err
		}
		p.Metrics().Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		if err := httpserve.Serve(ctx, "--metrics-addr", f.metrics, metricsHandler(p, backend)); err != nil {
			return err
		}
	}
	log.Info("weft-proxy starting", "mode", cfg.Mode, "node", cfg.NodeName, "nodeIPs", cfg.NodeIPs, "version", buildinfo.Version)
	go p.Run(ctx)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		return nil
	}
}

// printer is the --dry-run backend: it prints the first sync and stops.
type printer struct {
	render func(model.State) (string, error)
	done   context.CancelFunc
}

// dryRun returns what prints the rules a first sync of the backend writes.
func dryRun(backend proxy.Backend) (func(model.State) (string, error), error) {
	switch b := backend.(type) {
	case *iptables.Backend:
		return func(st model.State) (string, error) {
			var out strings.Builder
			for _, rs := range b.Render(st) {
				fmt.Fprintf(&out, "# IPv%d\n%s", rs.Family, iptables.Payload(rs))
			}
			return out.String(), nil
		}, nil
	case *nftables.Backend:
		return b.Dump, nil
	case *ipvs.Backend:
		return b.Dump, nil
	case *userspace.Backend:
		return b.Dump, nil
	}
	return nil, errors.New("not supported")
}

func (d printer) Sync(st model.State, _ bool) error {
	out, err := d.render(st)
	if err != nil {
		return err
	}
	fmt.Print(out)
	d.done()
	return nil
}

func (printer) Cleanup() error { return nil }

// metricsHandler serves the metrics, and with the userspace backend its
// service map on /services.
func metricsHandler(p *proxy.Proxier, backend proxy.Backend) http.Handler {
	us, ok := backend.(*userspace.Backend)
	if !ok {
		return p.Metrics().Handler()
	}
	mux := http.NewServeMux()
	mux.Handle("/", p.Metrics().Handler())
	mux.Handle("/services", us.ServicesHandler())
	return mux
}

// healthHandler answers /healthz like kube-proxy (200 once rules are
// synced, with the last update time) and /livez (the process is alive).
func healthHandler(p *proxy.Proxier) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if !p.Healthy() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"currentTime": time.Now().UTC(), "healthy": p.Healthy()})
	})
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	return mux
}
