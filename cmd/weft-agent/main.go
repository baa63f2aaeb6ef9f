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
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	cnpclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"

	"github.com/weftnet/weft/agent"
	"github.com/weftnet/weft/cni"
	"github.com/weftnet/weft/internal/buildinfo"
	"github.com/weftnet/weft/internal/cliflag"
	"github.com/weftnet/weft/internal/cniinstall"
	"github.com/weftnet/weft/internal/flagfile"
	"github.com/weftnet/weft/internal/httpserve"
	"github.com/weftnet/weft/kube"
	"github.com/weftnet/weft/proxy"
	"github.com/weftnet/weft/proxy/ebpf"
	"github.com/weftnet/weft/routing"
	"github.com/weftnet/weft/routing/bgp"
	"github.com/weftnet/weft/routing/wireguard"
	"github.com/weftnet/weft/topology"
)

// agentFlags are the node agent's own flags.
type agentFlags struct {
	kubeconfig, node, mode, confDir, binDir, dataDir, bridge, healthz string
	clusterCIDRs                                                      cliflag.Prefixes
	mtu                                                               int
	resync                                                            time.Duration
	cleanup                                                           bool
	networkPolicy, policyLogDrops                                     bool
	policyPendingTimeout                                              time.Duration
	dataplane, policyMode                                             string
	topologyExporter                                                  bool
	nodeBandwidth                                                     int64
	rack, tor                                                         string
	bgpConfig                                                         string
	statusLease                                                       string
	bgpPort                                                           int
	encryption, wgImpl                                                string
	encryptionStrict, ipipCrossSubnet                                 bool
	wgPort, pathMTUPort                                               int
}

func main() {
	var f agentFlags
	flag.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig path (default: in-cluster config)")
	flag.StringVar(&f.node, "node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
	flag.StringVar(&f.mode, "routing", "hostgw", "cross-node routing: hostgw, vxlan, ipip (IPv4 in IPv4; needs the kernel's ipip module), or bgp (an embedded BGP speaker: docs/bgp.md)")
	flag.BoolVar(&f.ipipCrossSubnet, "ipip-cross-subnet", false, "ipip routing: encapsulate only to nodes outside this node's underlay subnet (host-gw routes to the others)")
	flag.StringVar(&f.encryption, "encryption", agent.EncryptionNone, "encryption of pod traffic between nodes: none, or wireguard (in every routing mode; docs/encryption.md)")
	flag.BoolVar(&f.encryptionStrict, "encryption-strict", false, "wireguard: drop pod traffic to a node that has no tunnel (no or bad key or endpoint annotation) instead of sending it in clear")
	flag.StringVar(&f.wgImpl, "wireguard-implementation", string(wireguard.Auto), "wireguard: kernel, userspace (wireguard-go over /dev/net/tun, in the agent), or auto (the kernel's where it has WireGuard)")
	flag.IntVar(&f.wgPort, "wireguard-port", wireguard.DefaultPort, "wireguard: UDP port of the tunnel on the node's address")
	flag.IntVar(&f.pathMTUPort, "path-mtu-port", agent.DefaultPathMTUPort, "UDP port where the agent answers path MTU probes and sends its own to the other nodes' agents, exporting weft_path_mtu_bytes per node (0: off)")
	flag.StringVar(&f.statusLease, "cluster-policy-status-lease", "weft-system/weft-cluster-policy-status", "namespace/name of the Lease that elects the one agent writing the ClusterNetworkPolicies' status condition (empty: every agent writes)")
	flag.StringVar(&f.bgpConfig, "bgp-config", "weft-system/weft-bgp", "bgp routing: namespace/name of the BGP ConfigMap (key config.yaml; read live) and the namespace of its password Secrets")
	flag.IntVar(&f.bgpPort, "bgp-listen-port", 179, "bgp routing: TCP port the speaker accepts sessions on (-1: none, only outgoing)")
	flag.Var(&f.clusterCIDRs, "cluster-cidr", "pod CIDRs of the cluster, repeatable or comma-separated (masquerade exemption; default 10.244.0.0/16)")
	flag.StringVar(&f.confDir, "cni-conf-dir", "/etc/cni/net.d", "where to write the CNI configuration")
	flag.StringVar(&f.binDir, "cni-bin-dir", "/opt/cni/bin", "--cleanup: the CNI plugin directory weft's plugin is removed from")
	flag.StringVar(&f.dataDir, "ipam-data-dir", cni.DefaultDataDir, "the CNI plugin's IPAM state directory")
	flag.StringVar(&f.bridge, "bridge", cni.DefaultBridge, "node bridge for pods")
	flag.IntVar(&f.mtu, "mtu", 0, "pod MTU (default: underlay MTU minus encapsulation)")
	flag.DurationVar(&f.resync, "resync", 30*time.Second, "full resync period (repairs drift)")
	flag.StringVar(&f.healthz, "healthz-addr", ":9876", "address for /healthz and /metrics")
	flag.BoolVar(&f.cleanup, "cleanup", false, "remove everything weft-agent installed on this node and exit")
	flag.StringVar(&f.dataplane, "dataplane", agent.DataplaneIPTables, "where weft's packet rules live: iptables (iptables and ipset tools) or nftables (weft's own nftables tables, no iptables or ipset tool needed); the default of --proxy-mode and --policy-mode, and the agent's own masquerade rules")
	flag.BoolVar(&f.networkPolicy, "network-policy", true, "enforce NetworkPolicies for this node's pods")
	flag.StringVar(&f.policyMode, "policy-mode", "", "NetworkPolicy backend: iptables (chains and ipsets) or nftables (tables inet and bridge weft-policy) (default: the --dataplane)")
	flag.BoolVar(&f.policyLogDrops, "policy-log-drops", false, "the deny log: a JSON record on standard error of each connection attempt NetworkPolicy or ClusterNetworkPolicy denies (rate-limited), naming what denied it, and weft_policy_denied_total")
	flag.DurationVar(&f.policyPendingTimeout, "policy-pending-timeout", agent.DefaultPendingTimeout, "how long a new pod the agent cannot tie to a Pod object stays default-deny before it is released as one no policy selects")
	flag.BoolVar(&f.topologyExporter, "topology-exporter", true, "publish the node's network capacity (weft.dev/pod-ips, weft.dev/bandwidth, the pod-ips-exhausted taint) and topology labels, and shape pods requesting weft.dev/bandwidth")
	flag.Int64Var(&f.nodeBandwidth, "node-bandwidth", 0, "the node's bandwidth in Mbit/s for weft.dev/bandwidth (default: the uplink's reported speed)")
	flag.StringVar(&f.rack, "rack", "", "the node's rack, published as the label "+topology.RackLabel)
	flag.StringVar(&f.tor, "tor", "", "the node's top-of-rack switch, published as the label "+topology.ToRLabel)
	var px proxyFlags
	flag.StringVar(&px.mode, "proxy-mode", "", "service proxy backend: iptables, nftables, ipvs, ebpf, or none to leave Services to another proxy (default: the --dataplane)")
	flag.StringVar(&px.ipvsScheduler, "ipvs-scheduler", "", "ipvs proxy mode: the scheduler of every virtual server: rr, wrr, lc, sh, mh, ... (default rr)")
	flag.StringVar(&px.cgroupRoot, "cgroup-root", "", "ebpf proxy mode: cgroup v2 directory the socket programs attach to (default: the cgroup v2 mount)")
	flag.StringVar(&px.bpfPinPath, "bpf-pin-path", "", "ebpf proxy mode: bpffs directory of weft's pinned maps and links (default /sys/fs/bpf/weft)")
	flag.Var(&px.bpfDevices, "bpf-devices", "ebpf proxy mode: uplinks for traffic from outside the node, repeatable or comma-separated (default: the links holding the node IPs)")
	flag.IntVar(&px.bpfCTMax, "bpf-ct-max", 0, "ebpf proxy mode: entries of each conntrack map of the traffic from outside and of each flow map of the socket programs (0: a quarter percent of the node's memory, at least 65536)")
	flag.IntVar(&px.bpfLBMax, "bpf-lb-map-max", 0, "ebpf proxy mode: entries of the services map (frontends and their backend slots); the backends, affinity members and source ranges maps get half of it, the Maglev map a 64th (0: one per 4 KiB of the node's memory, 524288 to 4194304); a sync whose Services do not fit fails and writes nothing")
	flag.StringVar(&px.bpfXDP, "bpf-xdp", ebpf.XDPOff, "ebpf proxy mode: translate external traffic (NodePorts, externalIPs, LoadBalancer IPs) at the XDP hook of the uplinks, ahead of tc: off, auto (native where the driver supports it, tc elsewhere), native (a device without native XDP is an error), generic (the kernel's generic XDP, on any device)")
	flag.StringVar(&px.bpfLBMode, "bpf-lb-mode", ebpf.LBModeSNAT, "ebpf proxy mode: external traffic (eTP Cluster) to a backend of another node: snat (the node masquerades it, replies come back through it), dsr (IPv4: the backend's node answers the client directly, the backend sees the client's address; UDP needs 8 bytes of MTU headroom; the VXLAN device's rp_filter is set loose), hybrid (dsr for TCP, snat for UDP)")
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
	bpfCTMax      int
	bpfLBMax      int
	bpfLBMode     string
	bpfXDP        string
	ipvsScheduler string
}

// config turns the flags into the proxy's configuration.
func (f proxyFlags) config(node, zone string, cidrs []netip.Prefix, log *slog.Logger) proxy.Config {
	return proxy.Config{Mode: f.mode, NodeName: node, Zone: zone, ClusterCIDRs: cidrs, MasqueradeAll: f.masqAll,
		NodeIPs: f.nodeIPs, NodePortAddresses: f.nodePortAddrs,
		MinSyncPeriod: f.minSync, HealthCheckPorts: true, Log: log.With("component", "proxy"),
		CgroupRoot: f.cgroupRoot, BPFPinPath: f.bpfPinPath, BPFDevices: f.bpfDevices, BPFCTMax: f.bpfCTMax, BPFLBMax: f.bpfLBMax, BPFLBMode: f.bpfLBMode, BPFXDP: f.bpfXDP, IPVSScheduler: f.ipvsScheduler}
}

// nodeZone is the node's topology.kubernetes.io/zone label, which the
// proxy needs to follow the zone hints of EndpointSlices (trafficDistribution:
// PreferClose); "" when the node has none, or cannot be read within 30 s
// (the hints are then ignored, as kube-proxy ignores them on a node
// without a zone).
func nodeZone(client kubernetes.Interface, node string, log *slog.Logger) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err == nil {
			zone := n.Labels[corev1.LabelTopologyZone]
			log.Info("the node's zone", "zone", zone)
			return zone
		}
		select {
		case <-ctx.Done():
			log.Warn("reading the node's zone failed: zone hints are ignored", "node", node, "err", err)
			return ""
		case <-time.After(time.Second):
		}
	}
}

func run(log *slog.Logger, f agentFlags, px proxyFlags) error {
	node, mode := f.node, f.mode
	if node == "" {
		return errors.New("--node-name: required (or set NODE_NAME)")
	}
	if mode != string(routing.ModeHostGW) && mode != string(routing.ModeVXLAN) && mode != string(routing.ModeIPIP) && mode != string(bgp.Mode) {
		return fmt.Errorf("--routing: %q is none of hostgw, vxlan, ipip, bgp", mode)
	}
	if mode == string(routing.ModeIPIP) && !f.cleanup {
		if err := routing.CheckIPIP(); err != nil {
			return fmt.Errorf("--routing ipip: %w", err)
		}
	}
	bgpNS, bgpName, ok := strings.Cut(f.bgpConfig, "/")
	if !ok || bgpNS == "" || bgpName == "" {
		return fmt.Errorf("--bgp-config: %q is not namespace/name", f.bgpConfig)
	}
	leaseNS, leaseName, ok := strings.Cut(f.statusLease, "/")
	if f.statusLease != "" && (!ok || leaseNS == "" || leaseName == "") {
		return fmt.Errorf("--cluster-policy-status-lease: %q is not namespace/name", f.statusLease)
	}
	if f.bgpPort < -1 || f.bgpPort == 0 || f.bgpPort > 65535 {
		return fmt.Errorf("--bgp-listen-port: %d is not a port (or -1)", f.bgpPort)
	}
	if f.encryption != agent.EncryptionNone && f.encryption != agent.EncryptionWireGuard {
		return fmt.Errorf("--encryption: %q is neither %s nor %s", f.encryption, agent.EncryptionNone, agent.EncryptionWireGuard)
	}
	wgImpl, err := wireguard.ParseImplementation(f.wgImpl)
	if err != nil {
		return fmt.Errorf("--wireguard-implementation: %w", err)
	}
	if f.pathMTUPort < 0 || f.pathMTUPort > 65535 {
		return fmt.Errorf("--path-mtu-port: %d is not a port (or 0)", f.pathMTUPort)
	}
	if f.wgPort < 1 || f.wgPort > 65535 {
		return fmt.Errorf("--wireguard-port: %d is not a port", f.wgPort)
	}
	if f.policyPendingTimeout <= 0 {
		return fmt.Errorf("--policy-pending-timeout: %s is not positive", f.policyPendingTimeout)
	}
	if err := f.checkTopology(); err != nil {
		return err
	}
	if err := ebpf.CheckLBMode(px.bpfLBMode); err != nil {
		return err
	}
	if err := ebpf.CheckXDPMode(px.bpfXDP); err != nil {
		return err
	}
	if f.dataplane != agent.DataplaneIPTables && f.dataplane != agent.DataplaneNFTables {
		return fmt.Errorf("--dataplane: %q is neither %s nor %s", f.dataplane, agent.DataplaneIPTables, agent.DataplaneNFTables)
	}
	if px.mode == "" {
		px.mode = f.dataplane
	}
	if f.policyMode == "" {
		f.policyMode = f.dataplane
	}
	if f.policyMode != agent.PolicyModeIPTables && f.policyMode != agent.PolicyModeNFTables {
		return fmt.Errorf("--policy-mode: %q is neither %s nor %s", f.policyMode, agent.PolicyModeIPTables, agent.PolicyModeNFTables)
	}
	cidrs := []netip.Prefix(f.clusterCIDRs)
	client, err := kube.NewClient(f.kubeconfig, "weft-agent/"+buildinfo.Version)
	if err != nil {
		return err
	}
	a := agent.New(client, agent.Options{
		NodeName: node, Routing: routing.Mode(mode), IPIPCrossSubnet: f.ipipCrossSubnet, ClusterCIDRs: cidrs, CNIConfDir: f.confDir,
		IPAMDataDir: f.dataDir, Bridge: f.bridge, MTU: f.mtu, Resync: f.resync, Dataplane: f.dataplane, Log: log,
		Encryption: agent.EncryptionOptions{Mode: f.encryption, Strict: f.encryptionStrict,
			Implementation: wgImpl, Port: f.wgPort},
		PathMTUPort: f.pathMTUPort,
	})
	var p *proxy.Proxier
	if px.mode != "none" {
		var err error
		var backend proxy.Backend
		zone := ""
		if !f.cleanup {
			zone = nodeZone(client, node, log)
		}
		if p, backend, err = proxy.Build(px.config(node, zone, cidrs, log)); err != nil {
			return err
		}
		if !f.cleanup {
			proxy.Prepare(backend, log)
		}
	}
	var pc *agent.PolicyController
	clusterPolicies := false
	var cnpStatus agent.ClusterStatusWriter
	var cnpClient cnpclient.Interface
	var statusLeader *kube.StatusLeader
	if f.networkPolicy && !f.cleanup {
		if clusterPolicies, err = kube.ClusterPoliciesServed(client); err != nil {
			return err
		}
		if cnpClient, err = kube.NewClusterPolicyClient(f.kubeconfig, "weft-agent/"+buildinfo.Version); err != nil {
			return err
		}
		status := kube.ClusterPolicyStatus{Client: cnpClient}
		if f.statusLease != "" {
			statusLeader = &kube.StatusLeader{}
			status.Leading = statusLeader.Leading
		}
		cnpStatus = status
	}
	if f.networkPolicy || f.cleanup {
		if pc, err = agent.NewPolicyController(agent.PolicyOptions{NodeName: node, Mode: f.policyMode, LogDrops: f.policyLogDrops, Resync: f.resync,
			IPAMDataDir: f.dataDir, Bridge: f.bridge, PendingTimeout: f.policyPendingTimeout, ClusterPolicies: clusterPolicies,
			ClusterStatus: cnpStatus, Log: log.With("component", "policy")}); err != nil {
			return fmt.Errorf("--policy-mode %s: %w", f.policyMode, err)
		}
	}
	if f.cleanup {
		errs := []error{a.Cleanup(), pc.Cleanup(), agent.CleanupShaping(), cniinstall.Uninstall(f.binDir, "weft", "weft-plugin")}
		if p != nil {
			errs = append(errs, p.Cleanup())
		}
		return errors.Join(errs...)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var extra []*prometheus.Registry
	var checks []agent.ReadyCheck
	if p != nil {
		extra = append(extra, p.Metrics().Registry)
		checks = append(checks, agent.ReadyCheck{Name: "service proxy (" + px.mode + ")", OK: p.Healthy})
	}
	if f.networkPolicy {
		extra = append(extra, pc.Registry())
	}
	if err := httpserve.Serve(ctx, "--healthz-addr", f.healthz, a.Handler(checks, extra...)); err != nil {
		return err
	}
	log.Info("weft-agent starting", "node", node, "routing", mode, "dataplane", f.dataplane, "proxy", px.mode, "networkPolicy", f.networkPolicy,
		"encryption", f.encryption, "policyMode", f.policyMode, "version", buildinfo.Version)
	if f.networkPolicy {
		go pc.Run(ctx)
		go func() {
			if err := kube.WatchPolicies(ctx, client, pc); err != nil {
				log.Error("watching network policies", "err", err)
			}
		}()
		go watchClusterPolicies(ctx, client, cnpClient, pc, clusterPolicies, log)
		if statusLeader != nil {
			go statusLeader.Run(ctx, client, leaseNS, leaseName, node, pc.SyncSoon, log.With("component", "policy"))
		}
		if f.policyLogDrops {
			go func() {
				if err := pc.RunDenyLog(ctx, slog.New(slog.NewJSONHandler(os.Stderr, nil))); err != nil {
					log.Error("the deny log stopped", "err", err)
				}
			}()
		}
	}
	if f.topologyExporter {
		exp := agent.NewTopologyExporter(client, agent.TopologyOptions{NodeName: node, Routing: routing.Mode(mode), MTU: f.mtu,
			Encryption: f.encryption, IPAMDataDir: f.dataDir, BandwidthMbit: f.nodeBandwidth, Rack: f.rack, ToR: f.tor, Resync: f.resync,
			Log: log.With("component", "topology")})
		go func() {
			if err := exp.Run(ctx); err != nil {
				log.Error("topology exporter", "err", err)
			}
		}()
	}
	if mode == string(bgp.Mode) {
		b, err := agent.NewBGP(client, agent.BGPOptions{NodeName: node, ClusterCIDRs: cidrs, ConfigNamespace: bgpNS, ConfigName: bgpName,
			ListenPort: int32(f.bgpPort), Resync: f.resync, Log: log.With("component", "bgp")})
		if err != nil {
			return err
		}
		go func() {
			if err := b.Run(ctx); err != nil {
				log.Error("bgp", "err", err)
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

// checkTopology validates the exporter's flags: the rack and ToR become
// label values.
func (f agentFlags) checkTopology() error {
	if f.nodeBandwidth < 0 {
		return fmt.Errorf("--node-bandwidth: %d is negative", f.nodeBandwidth)
	}
	for name, v := range map[string]string{"--rack": f.rack, "--tor": f.tor} {
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return fmt.Errorf("%s: %q is not a label value: %s", name, v, strings.Join(errs, "; "))
		}
	}
	return nil
}

// watchClusterPolicies feeds pc the ClusterNetworkPolicies. Their CRD may
// be installed after the agent started: until it is served, the agent
// looks again every 30 s.
func watchClusterPolicies(ctx context.Context, client kubernetes.Interface, cc cnpclient.Interface, pc *agent.PolicyController, served bool, log *slog.Logger) {
	if !served {
		log.Info("ClusterNetworkPolicies are not served (the CRD of sigs.k8s.io/network-policy-api is not installed): looking again every 30 s")
	}
	for !served {
		select {
		case <-ctx.Done():
			return
		case <-time.After(30 * time.Second):
		}
		var err error
		if served, err = kube.ClusterPoliciesServed(client); err != nil {
			log.Error("looking for ClusterNetworkPolicies", "err", err)
		}
	}
	log.Info("enforcing ClusterNetworkPolicies", "api", kube.ClusterPolicyGroupVersion)
	if err := kube.WatchClusterPolicies(ctx, client, cc, pc); err != nil {
		log.Error("watching cluster network policies", "err", err)
	}
}
