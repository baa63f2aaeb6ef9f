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
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/weftnet/weft/agent"
	"github.com/weftnet/weft/cni"
	"github.com/weftnet/weft/internal/buildinfo"
	"github.com/weftnet/weft/routing"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig path (default: in-cluster config)")
	node := flag.String("node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
	mode := flag.String("routing", "hostgw", "cross-node routing: hostgw or vxlan")
	clusterCIDR := flag.String("cluster-cidr", "10.244.0.0/16", "pod CIDRs of the cluster, comma-separated (masquerade exemption)")
	confDir := flag.String("cni-conf-dir", "/etc/cni/net.d", "where to write the CNI configuration")
	dataDir := flag.String("ipam-data-dir", cni.DefaultDataDir, "the CNI plugin's IPAM state directory")
	bridge := flag.String("bridge", cni.DefaultBridge, "node bridge for pods")
	mtu := flag.Int("mtu", 0, "pod MTU (default: underlay MTU minus encapsulation)")
	resync := flag.Duration("resync", 30*time.Second, "full resync period (repairs drift)")
	healthz := flag.String("healthz-addr", ":9876", "address for /healthz and /metrics")
	cleanup := flag.Bool("cleanup", false, "remove everything weft-agent installed on this node and exit")
	flag.Parse()

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(log, *kubeconfig, *node, *mode, *clusterCIDR, *confDir, *dataDir, *bridge, *mtu, *resync, *healthz, *cleanup); err != nil {
		log.Error("weft-agent failed", "err", err)
		os.Exit(1)
	}
}

func run(log *slog.Logger, kubeconfig, node, mode, clusterCIDR, confDir, dataDir, bridge string, mtu int, resync time.Duration, healthz string, cleanup bool) error {
	if node == "" {
		return errors.New("--node-name: required (or set NODE_NAME)")
	}
	if mode != string(routing.ModeHostGW) && mode != string(routing.ModeVXLAN) {
		return fmt.Errorf("--routing: %q is neither hostgw nor vxlan", mode)
	}
	var cidrs []netip.Prefix
	for _, s := range strings.Split(clusterCIDR, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("--cluster-cidr: %w", err)
		}
		cidrs = append(cidrs, p.Masked())
	}
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return err
	}
	cfg.UserAgent = "weft-agent/" + buildinfo.Version
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	a := agent.New(client, agent.Options{
		NodeName: node, Routing: routing.Mode(mode), ClusterCIDRs: cidrs, CNIConfDir: confDir,
		IPAMDataDir: dataDir, Bridge: bridge, MTU: mtu, Resync: resync, Log: log,
	})
	if cleanup {
		return a.Cleanup()
	}
	ln, err := net.Listen("tcp", healthz)
	if err != nil {
		return fmt.Errorf("--healthz-addr: %w", err)
	}
	go func() { _ = http.Serve(ln, a.Handler()) }()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log.Info("weft-agent starting", "node", node, "routing", mode, "version", buildinfo.Version)
	return a.Run(ctx)
}
