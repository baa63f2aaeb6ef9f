// Command weft-agent is weft's per-node daemon (a DaemonSet pod on every
// node): it writes the node's CNI configuration and programs masquerading
// and the routes to the other nodes' pods.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weftnet/weft/agent"
	"github.com/weftnet/weft/cni"
	"github.com/weftnet/weft/internal/buildinfo"
	"github.com/weftnet/weft/internal/cliflag"
	"github.com/weftnet/weft/internal/flagfile"
	"github.com/weftnet/weft/internal/httpserve"
	"github.com/weftnet/weft/kube"
	"github.com/weftnet/weft/proxy"
	"github.com/weftnet/weft/routing"
)

// agentFlags are the node agent's own flags.
type agentFlags struct {
	kubeconfig, node, mode, confDir, dataDir, bridge, healthz string
	clusterCIDRs                                              cliflag.Prefixes
	mtu                                                       int
	resync                                                    time.Duration
	cleanup                                                   bool
	networkPolicy, policyLogDrops                             bool
	policyPendingTimeout                                      time.Duration
}

func main() {
	var f agentFlags
	flag.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig path (default: in-cluster config)")
	flag.StringVar(&f.node, "node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
	flag.StringVar(&f.mode, "routing", "hostgw", "cross-node routing: hostgw or vxlan")
	flag.Var(&f.clusterCIDRs, "cluster-cidr", "pod CIDRs of the cluster, repeatable or comma-separated (masquerade exemption; default 10.244.0.0/16)")
	flag.StringVar(&f.confDir, "cni-conf-dir", "/etc/cni/net.d", "where to write the CNI configuration")
	flag.StringVar(&f.dataDir, "ipam-data-dir", cni.DefaultDataDir, "the CNI plugin's IPAM state directory")
	flag.StringVar(&f.bridge, "bridge", cni.DefaultBridge, "node bridge for pods")
	flag.IntVar(&f.mtu, "mtu", 0, "pod MTU (default: underlay MTU minus encapsulation)")
	flag.DurationVar(&f.resync, "resync", 30*time.Second, "full resync period (repairs drift)")
	flag.StringVar(&f.healthz, "healthz-addr", ":9876", "address for /healthz and /metrics")
	flag.BoolVar(&f.cleanup, "cleanup", false, "remove everything weft-agent installed on this node and exit")
	flag.BoolVar(&f.networkPolicy, "network-policy", true, "enforce NetworkPolicies for this node's pods (iptables + ipset)")
	flag.BoolVar(&f.policyLogDrops, "policy-log-drops", false, "log packets dropped by NetworkPolicy (rate-limited kernel log)")
	flag.DurationVar(&f.policyPendingTimeout, "policy-pending-timeout", agent.DefaultPendingTimeout, "how long a new pod the agent cannot tie to a Pod object stays default-deny before it is released as one no policy selects")
	var px proxyFlags
	flag.StringVar(&px.mode, "proxy-mode", "iptables", "service proxy backend: iptables, nftables, ebpf, or none to leave Services to another proxy")
	flag.StringVar(&px.cgroupRoot, "cgroup-root", "", "ebpf proxy mode: cgroup v2 directory the socket programs attach to (default: the cgroup v2 mount)")
	flag.StringVar(&px.bpfPinPath, "bpf-pin-path", "", "ebpf proxy mode: bpffs directory of weft's pinned maps and links (default /sys/fs/bpf/weft)")
	flag.Var(&px.bpfDevices, "bpf-devices", "ebpf proxy mode: uplinks for traffic from outside the node, repeatable or comma-separated (default: the links holding the node IPs)")
	flag.Var(&px.nodeIPs, "node-ip", "this node's addresses, repeatable or comma-separated (NodePorts answer on them; default $NODE_IP)")
	flag.Var(&px.nodePortAddrs, "nodeport-addresses", "CIDRs selecting the node IPs NodePorts answer on (default: every --node-ip)")
	flag.BoolVar(&px.masqAll, "masquerade-all", false, "masquerade all traffic to ClusterIPs")
	flag.DurationVar(&px.minSync, "min-sync-period", 100*time.Millisecond, "minimum time between proxy syncs")
	config := flag.String("config", "", "a YAML file of flag names to values, or a directory of one file per flag (the weft-agent ConfigMap); the command line wins over it")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if *config != "" {
		if err := flagfile.Apply(flag.CommandLine, *config, "config"); err != nil {
			log.Error("weft-agent failed", "err", err)
			os.Exit(2)
		}
	}
	if len(f.clusterCIDRs) == 0 {
		_ = f.clusterCIDRs.Set("10.244.0.0/16")
	}
	if len(px.nodeIPs) == 0 && os.Getenv("NODE_IP") != "" {
		if err := px.nodeIPs.Set(os.Getenv("NODE_IP")); err != nil {
			log.Error("weft-agent failed", "err", fmt.Errorf("$NODE_IP: %w", err))
			os.Exit(2)
		}
	}
	if err := run(log, f, px); err != nil {
		log.Error("weft-agent failed", "err", err)
		os.Exit(1)
	}
}

// proxyFlags configure the service proxy the agent runs.
type proxyFlags struct {
	mode          string
	nodeIPs       cliflag.Addrs
	nodePortAddrs cliflag.Prefixes
	masqAll       bool
	minSync       time.Duration
	cgroupRoot    string
	bpfPinPath    string
	bpfDevices    cliflag.Names
}

// config turns the flags into the proxy's configuration.
func (f proxyFlags) config(node string, cidrs []netip.Prefix, log *slog.Logger) proxy.Config {
	return proxy.Config{Mode: f.mode, NodeName: node, ClusterCIDRs: cidrs, MasqueradeAll: f.masqAll,
		NodeIPs: f.nodeIPs, NodePortAddresses: f.nodePortAddrs,
		MinSyncPeriod: f.minSync, HealthCheckPorts: true, Log: log.With("component", "proxy"),
		CgroupRoot: f.cgroupRoot, BPFPinPath: f.bpfPinPath, BPFDevices: f.bpfDevices}
}

func run(log *slog.Logger, f agentFlags, px proxyFlags) error {
	node, mode := f.node, f.mode
	if node == "" {
		return errors.New("--node-name: required (or set NODE_NAME)")
	}
	if mode != string(routing.ModeHostGW) && mode != string(routing.ModeVXLAN) {
		return fmt.Errorf("--routing: %q is neither hostgw nor vxlan", mode)
	}
	if f.policyPendingTimeout <= 0 {
		return fmt.Errorf("--policy-pending-timeout: %s is not positive", f.policyPendingTimeout)
	}
	cidrs := []netip.Prefix(f.clusterCIDRs)
	client, err := kube.NewClient(f.kubeconfig, "weft-agent/"+buildinfo.Version)
	if err != nil {
		return err
	}
	a := agent.New(client, agent.Options{
		NodeName: node, Routing: routing.Mode(mode), ClusterCIDRs: cidrs, CNIConfDir: f.confDir,
		IPAMDataDir: f.dataDir, Bridge: f.bridge, MTU: f.mtu, Resync: f.resync, Log: log,
	})
	var p *proxy.Proxier
	if px.mode != "none" {
		var err error
		if p, _, err = proxy.Build(px.config(node, cidrs, log)); err != nil {
			return err
		}
	}
	var pc *agent.PolicyController
	if f.networkPolicy || f.cleanup {
		pc = agent.NewPolicyController(agent.PolicyOptions{NodeName: node, LogDrops: f.policyLogDrops, Resync: f.resync,
			IPAMDataDir: f.dataDir, Bridge: f.bridge, PendingTimeout: f.policyPendingTimeout, Log: log.With("component", "policy")})
	}
	if f.cleanup {
		errs := []error{a.Cleanup(), pc.Cleanup()}
		if p != nil {
			errs = append(errs, p.Cleanup())
		}
		return errors.Join(errs...)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var extra []*prometheus.Registry
	if p != nil {
		extra = append(extra, p.Metrics().Registry)
	}
	if f.networkPolicy {
		extra = append(extra, pc.Registry())
	}
	if err := httpserve.Serve(ctx, "--healthz-addr", f.healthz, a.Handler(extra...)); err != nil {
		return err
	}
	log.Info("weft-agent starting", "node", node, "routing", mode, "proxy", px.mode, "networkPolicy", f.networkPolicy, "version", buildinfo.Version)
	if f.networkPolicy {
		go pc.Run(ctx)
		go func() {
			if err := kube.WatchPolicies(ctx, client, pc); err != nil {
				log.Error("watching network policies", "err", err)
			}
		}()
	}
	if p != nil {
		go p.Run(ctx)
		go func() {
			if err := kube.WatchServices(ctx, client, p); err != nil {
				log.Error("watching services", "err", err)
			}
		}()
	}
	return a.Run(ctx)
}
