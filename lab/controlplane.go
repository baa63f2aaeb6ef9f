package lab

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/lab/pki"
)

// kubernetesServiceIP is the first address of the service range: the
// "kubernetes" Service's ClusterIP, which the API server's certificate names.
var kubernetesServiceIP = netip.MustParseAddr(KubernetesServiceIP)

// identities the control plane and the nodes use, and their groups.
const (
	adminUser         = "weft-lab-admin"
	controllerManager = "system:kube-controller-manager"
	scheduler         = "system:kube-scheduler"
	// AgentGroup is the group of every weft-agent identity; deploy/agent/rbac.yaml
	// binds the weft-agent ClusterRole to it.
	AgentGroup = "weft:agents"
)

// issueCerts writes the lab's PKI into dir/pki and the kubeconfigs into dir.
func issueCerts(dir string, nodes []Member, apiPort int) error {
	pkiDir := filepath.Join(dir, "pki")
	if err := os.MkdirAll(pkiDir, 0o700); err != nil {
		return err
	}
	ca, err := pki.NewCA("weft-lab-ca")
	if err != nil {
		return err
	}
	if err := pki.WritePair(pkiDir, "ca", ca.Cert, ca.Key); err != nil {
		return err
	}
	server, err := ca.Issue(pki.Leaf{
		CommonName: "kube-apiserver", Server: true,
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPs:      []net.IP{net.IPv4(127, 0, 0, 1), ControlIP.AsSlice(), kubernetesServiceIP.AsSlice()},
	})
	if err != nil {
		return err
	}
	if err := pki.WritePair(pkiDir, "apiserver", server.Cert, server.Key); err != nil {
		return err
	}
	sa, err := ca.Issue(pki.Leaf{CommonName: "service-accounts"})
	if err != nil {
		return err
	}
	if err := pki.WritePair(pkiDir, "sa", sa.Cert, sa.Key); err != nil {
		return err
	}
	saPub, err := pki.PublicKeyPEM(sa.Key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(pkiDir, "sa.pub"), saPub, 0o644); err != nil {
		return err
	}

	// The API server's identity toward kubelets (logs, exec,
	// port-forward): kubelets authorize it by webhook, as system:masters.
	kc, err := ca.Issue(pki.Leaf{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}})
	if err != nil {
		return err
	}
	if err := pki.WritePair(pkiDir, "apiserver-kubelet-client", kc.Cert, kc.Key); err != nil {
		return err
	}

	inLab := fmt.Sprintf("https://%s:%d", ControlIP, APIServerPort)
	type client struct {
		file, cn, server string
		groups           []string
	}
	clients := []client{
		{"admin", adminUser, fmt.Sprintf("https://127.0.0.1:%d", apiPort), []string{"system:masters"}},
		// The admin from inside the lab (its external host, e.g. the
		// upstream e2e suite): the API server on the underlay.
		{"admin-underlay", adminUser, inLab, []string{"system:masters"}},
		{"controller-manager", controllerManager, inLab, nil},
		{"scheduler", scheduler, inLab, nil},
	}
	for _, n := range nodes {
		clients = append(clients,
			client{n.Name + "-agent", "weft-agent:" + n.Name, inLab, []string{AgentGroup}},
			client{n.Name + "-kubelet", "system:node:" + n.Name, inLab, []string{"system:nodes"}},
		)
	}
	for _, c := range clients {
		pair, err := ca.Issue(pki.Leaf{CommonName: c.cn, Organization: c.groups})
		if err != nil {
			return err
		}
		if err := writeKubeconfig(filepath.Join(dir, c.file+".kubeconfig"), c.server, ca.Cert, pair); err != nil {
			return err
		}
	}
	return nil
}

// DefaultPodCIDRSize is the prefix length of a lab node's podCIDR.
const DefaultPodCIDRSize = 24

// checkPodCIDRSize accepts a podCIDR prefix length (0: the default) that
// fits the cluster CIDR and leaves a pod address (a /30: one).
func checkPodCIDRSize(size int) error {
	cluster := netip.MustParsePrefix(ClusterCIDR)
	if size != 0 && (size < cluster.Bits() || size > 30) {
		return fmt.Errorf("--pod-cidr-size: %d is not between %d (the cluster CIDR %s) and 30", size, cluster.Bits(), ClusterCIDR)
	}
	return nil
}

// controlPlane returns the control-plane daemons, all in the cp namespace;
// each node's podCIDR is a /podCIDRSize of the cluster CIDR (0: the default).
func controlPlane(o Options) []Proc {
	dir, binDir, podCIDRSize := o.Dir, o.BinDir, o.PodCIDRSize
	if podCIDRSize == 0 {
		podCIDRSize = DefaultPodCIDRSize
	}
	p := func(name string) string { return filepath.Join(dir, "pki", name) }
	ns := netnsutil.RunDir + "/" + ControlNS
	return []Proc{
		{Name: "etcd", NS: ns, Args: []string{"etcd",
			"--data-dir", filepath.Join(dir, "etcd"),
			"--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
			"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
			"--initial-cluster", "default=http://127.0.0.1:2380", "--log-level", "warn",
		}},
		{Name: "kube-apiserver", NS: ns, Args: []string{filepath.Join(binDir, "kube-apiserver"),
			"--etcd-servers", "http://127.0.0.1:2379",
			"--advertise-address", ControlIP.String(), "--bind-address", "0.0.0.0", "--secure-port", strconv.Itoa(APIServerPort),
			"--tls-cert-file", p("apiserver.crt"), "--tls-private-key-file", p("apiserver.key"), "--client-ca-file", p("ca.crt"),
			"--service-cluster-ip-range", o.serviceCIDRs(),
			"--authorization-mode", "Node,RBAC", "--enable-admission-plugins", "NodeRestriction",
			"--service-account-key-file", p("sa.pub"), "--service-account-signing-key-file", p("sa.key"),
			"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
			"--allow-privileged", "--profiling=false", "--v", "1",
			// The API server reaches the kubelets (logs, exec,
			// port-forward) at their InternalIP with a client
			// certificate of its own.
			"--kubelet-preferred-address-types", "InternalIP",
			"--kubelet-client-certificate", p("apiserver-kubelet-client.crt"), "--kubelet-client-key", p("apiserver-kubelet-client.key"),
		}},
		{Name: "kube-controller-manager", NS: ns, Args: append([]string{filepath.Join(binDir, "kube-controller-manager"),
			"--kubeconfig", filepath.Join(dir, "controller-manager.kubeconfig"),
			"--authentication-kubeconfig", filepath.Join(dir, "controller-manager.kubeconfig"),
			"--authorization-kubeconfig", filepath.Join(dir, "controller-manager.kubeconfig"),
			"--use-service-account-credentials", "--service-account-private-key-file", p("sa.key"), "--root-ca-file", p("ca.crt"),
			"--allocate-node-cidrs", "--cluster-cidr", o.clusterCIDRs(),
			"--service-cluster-ip-range", o.serviceCIDRs(),
			// A node whose kubelet stopped is NotReady after 20 s (the
			// default is 50 s; the kubelets renew their leases every 10 s).
			"--node-monitor-grace-period", "20s",
			"--leader-elect=false", "--bind-address", "127.0.0.1", "--v", "1",
		}, o.nodeCIDRMaskSize(podCIDRSize)...)},
		// The stock scheduler binds pods that name no node, with the
		// default plugins (resources, taints, spreading).
		{Name: "kube-scheduler", NS: ns, Args: []string{filepath.Join(binDir, "kube-scheduler"),
			"--kubeconfig", filepath.Join(dir, "scheduler.kubeconfig"),
			"--authentication-kubeconfig", filepath.Join(dir, "scheduler.kubeconfig"),
			"--authorization-kubeconfig", filepath.Join(dir, "scheduler.kubeconfig"),
			"--leader-elect=false", "--bind-address", "127.0.0.1", "--v", "1",
		}},
	}
}

// waitAPIServer polls /readyz from inside the control-plane namespace.
func waitAPIServer(ctx context.Context, dir string) error {
	caPEM, err := os.ReadFile(filepath.Join(dir, "pki", "ca.crt"))
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool},
		DialContext:     netnsutil.Dialer(netnsutil.RunDir+"/"+ControlNS, nil),
	}}
	url := fmt.Sprintf("https://%s:%d/readyz", ControlIP, APIServerPort)
	for {
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kube-apiserver not ready (see %s): %w", logPath(dir, "kube-apiserver"), ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// clusterCIDRs and serviceCIDRs are the lab's pod and Service ranges, as
// the control plane's flags take them (IPv4 first).
func (o Options) clusterCIDRs() string {
	if o.DualStack {
		return ClusterCIDR + "," + ClusterCIDR6
	}
	return ClusterCIDR
}

func (o Options) serviceCIDRs() string {
	if o.DualStack {
		return ServiceCIDR + "," + ServiceCIDR6
	}
	return ServiceCIDR
}

// nodeCIDRMaskSize is the controller-manager's podCIDR size flag: one
// size, or a size per family on a dual-stack lab (a /64 of IPv6), which
// single-stack refuses.
func (o Options) nodeCIDRMaskSize(v4 int) []string {
	if o.DualStack {
		return []string{"--node-cidr-mask-size-ipv4", strconv.Itoa(v4), "--node-cidr-mask-size-ipv6", "64"}
	}
	return []string{"--node-cidr-mask-size", strconv.Itoa(v4)}
}
