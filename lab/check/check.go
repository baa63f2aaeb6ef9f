// Package check is weft's connectivity test on a lab: it runs probe pods on
// every node and proves, with real HTTP exchanges that report the source
// address the server saw, that pods reach pods on the same and on other
// nodes, nodes reach pods, pods reach nodes, pods reach an external host
// masqueraded behind their node's address, and a Service over the probe pods
// answers on its ClusterIP (from pods and nodes) and its NodePort (from the
// external host, source-NATed to the node). DF-marked datagrams of exactly
// the pod MTU cross every path between nodes (mtu.go). Last, a NetworkPolicy isolates
// one probe pod: only the allowed peer and the pod's own node reach it, until
// the policy is deleted.
package check

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/lab"
	"github.com/weftnet/weft/lab/workload"
)

// Namespace holds the probe pods.
const Namespace = "weft-check"

// Result is one row of the report.
type Result struct {
	Kind, From, To string
	OK             bool
	Detail         string
}

// endpoint is something probes start from or go to.
type endpoint struct {
	name   string
	nsPath string       // where a probe from it runs
	dial   lab.DialFunc // how a probe from it connects (lab.State.Dialer)
	ip     net.IP       // where probes to it go
	node   lab.Member   // the node it lives on (the node itself for nodes)
}

// Run deploys the probe pods, runs every probe and returns the rows. The
// probe pods are removed at the end unless keep is set.
func Run(ctx context.Context, st *lab.State, c kubernetes.Interface, keep bool) ([]Result, error) {
	nodes := lab.NodeMembers(st.Members)
	pods, err := deploy(ctx, st, c, nodes)
	if err != nil {
		return nil, err
	}
	for i := range pods {
		pods[i].dial = st.Dialer(pods[i].nsPath)
	}
	if !keep {
		defer func() {
			_ = c.CoreV1().Namespaces().Delete(context.WithoutCancel(ctx), Namespace, metav1.DeleteOptions{})
		}()
	}
	var ext lab.Member
	for _, m := range st.Members {
		if m.NS == lab.ExternalNS {
			ext = m
		}
	}
	var out []Result
	// A new pod is dark until its node's agent has programmed its
	// NetworkPolicy state (the pending window, docs/architecture.md): the
	// probes to and from the fresh probe pods wait that long.
	probe := func(kind string, from, to endpoint, url string, want func(workload.Reply) error) {
		out = append(out, probeHTTP(ctx, kind, from.name, from.dial, to.name, url, want, 10*time.Second))
	}
	sawFrom := func(pod string, src net.IP) func(workload.Reply) error {
		return func(r workload.Reply) error {
			if r.Pod != pod {
				return fmt.Errorf("answered by %q, want %q", r.Pod, pod)
			}
			if r.Client != src.String() {
				return fmt.Errorf("%s saw client %s, want %s", r.Pod, r.Client, src)
			}
			return nil
		}
	}
	// A node's own traffic may leave from any of its addresses (its underlay
	// address, its bridge, its VXLAN device), but from no other.
	nodeAddrs := map[string]map[string]bool{}
	for _, n := range nodes {
		own, err := addrsIn(n.NSPath())
		if err != nil {
			return nil, fmt.Errorf("addresses of %s: %w", n.Name, err)
		}
		nodeAddrs[n.Name] = own
	}
	sawNode := func(pod string, n lab.Member) func(workload.Reply) error {
		own := nodeAddrs[n.Name]
		return func(r workload.Reply) error {
			switch {
			case r.Pod != pod:
				return fmt.Errorf("answered by %q, want %q", r.Pod, pod)
			case !own[r.Client]:
				return fmt.Errorf("%s saw client %s, not an address of %s", r.Pod, r.Client, n.Name)
			}
			return nil
		}
	}
	for _, a := range pods {
		for _, b := range pods {
			if a.name == b.name {
				continue
			}
			kind := "pod to pod, other node"
			if a.node.Name == b.node.Name {
				kind = "pod to pod, same node"
			}
			probe(kind, a, b, "http://"+net.JoinHostPort(b.ip.String(), "80")+"/", sawFrom(b.name, a.ip))
		}
	}
	for _, n := range nodes {
		from := endpoint{name: n.Name, nsPath: n.NSPath(), dial: st.Dialer(n.NSPath()), node: n}
		for _, p := range pods {
			probe("node to pod", from, p, "http://"+net.JoinHostPort(p.ip.String(), "80")+"/", sawNode(p.name, n))
		}
	}
	for _, p := range pods {
		for _, n := range nodes {
			to := endpoint{name: n.Name, ip: n.IP.AsSlice(), node: n}
			r := Result{Kind: "pod to node", From: p.name, To: n.Name}
			err := httpOK(ctx, p.dial, fmt.Sprintf("http://%s/healthz", net.JoinHostPort(to.ip.String(), fmt.Sprint(lab.AgentPort))))
			r.OK, r.Detail = err == nil, "weft-agent /healthz 200"
			if err != nil {
				r.Detail = err.Error()
			}
			out = append(out, r)
		}
		extEP := endpoint{name: "external", ip: ext.IP.AsSlice()}
		probe("pod to external (masqueraded)", p, extEP, "http://"+net.JoinHostPort(ext.IP.String(), "80")+"/",
			sawFrom("external", p.node.IP.AsSlice()))
	}
	out = append(out, mtuPodRows(ctx, pods)...)
	out = append(out, clusterDNS(ctx, pods)...)
	out = append(out, services(ctx, st, c, pods, nodes, ext, sawNode)...)
	out = append(out, policies(ctx, st, c, pods)...)
	return out, nil
}

// clusterDNS adds a row per probe pod: the pod resolves the kubernetes
// Service's name through the cluster DNS address (weft-dns from deploy/,
// reached through the node's service proxy).
func clusterDNS(ctx context.Context, pods []endpoint) []Result {
	const name = "kubernetes.default.svc.cluster.local"
	var out []Result
	for _, p := range pods {
		r := Result{Kind: "pod to cluster DNS", From: p.name, To: lab.ClusterDNS + " (" + name + ")"}
		resolver := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return p.dial(ctx, network, net.JoinHostPort(lab.ClusterDNS, "53"))
		}}
		var addrs []string
		var err error
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			addrs, err = resolver.LookupHost(qctx, name)
			cancel()
			if err == nil || time.Now().After(deadline) {
				break
			}
		}
		switch {
		case err != nil:
			r.Detail = err.Error()
		case len(addrs) != 1 || addrs[0] != lab.KubernetesServiceIP:
			r.Detail = fmt.Sprintf("resolved to %v, want %s", addrs, lab.KubernetesServiceIP)
		default:
			r.OK, r.Detail = true, "resolved to "+addrs[0]
		}
		out = append(out, r)
	}
	return out
}

// services adds the Service rows: a NodePort Service over the probe pods,
// reached by ClusterIP from every pod and node, and by NodePort on every
// node from the external host.
func services(ctx context.Context, st *lab.State, c kubernetes.Interface, pods []endpoint, nodes []lab.Member, ext lab.Member,
	sawNode func(string, lab.Member) func(workload.Reply) error) []Result {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "probe"}, Spec: corev1.ServiceSpec{
		Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"app": "weft-check"},
		Ports: []corev1.ServicePort{{Name: "http", Port: 80}, {Name: "udp", Port: echoPort, Protocol: corev1.ProtocolUDP}},
	}}
	svc, err := c.CoreV1().Services(Namespace).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return []Result{{Kind: "service", From: "-", To: "probe", Detail: err.Error()}}
	}
	isProbe := map[string]bool{}
	for _, p := range pods {
		isProbe[p.name] = true
	}
	anyProbe := func(r workload.Reply) error {
		if !isProbe[r.Pod] {
			return fmt.Errorf("answered by %q, not a probe pod", r.Pod)
		}
		return nil
	}
	var out []Result
	// The proxies program the Service within moments of its endpoints; a
	// probe may retry for a few seconds.
	probe := func(kind, from, nsPath, to, url string, want func(workload.Reply) error) {
		out = append(out, probeHTTP(ctx, kind, from, st.Dialer(nsPath), to, url, want, 10*time.Second))
	}
	vip := "http://" + net.JoinHostPort(svc.Spec.ClusterIP, "80") + "/"
	for _, p := range pods {
		probe("pod to ClusterIP", p.name, p.nsPath, "svc/probe", vip, anyProbe)
	}
	for _, n := range nodes {
		probe("node to ClusterIP", n.Name, n.NSPath(), "svc/probe", vip, anyProbe)
	}
	nodePort := fmt.Sprint(svc.Spec.Ports[0].NodePort)
	for _, n := range nodes {
		probe("external to NodePort (SNAT)", "external", ext.NSPath(), n.Name+":"+nodePort,
			"http://"+net.JoinHostPort(n.IP.String(), nodePort)+"/", func(r workload.Reply) error {
				if err := anyProbe(r); err != nil {
					return err
				}
				return sawNode(r.Pod, n)(r)
			})
	}
	if len(nodes) > 1 {
		out = append(out, mtuServiceRows(ctx, st, pods, nodes, ext, svc.Spec.ClusterIP, svc.Spec.Ports[1].NodePort)...)
	}
	return out
}

// deploy creates one probe pod per node, and a second on the first node,
// and waits until they run.
func deploy(ctx context.Context, st *lab.State, c kubernetes.Interface, nodes []lab.Member) ([]endpoint, error) {
	err := c.CoreV1().Namespaces().Delete(ctx, Namespace, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, err
	}
	for { // a previous run's namespace may still be terminating
		_, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}, metav1.CreateOptions{})
		if err == nil {
			if err := lab.WaitServiceAccount(ctx, c, Namespace); err != nil {
				return nil, err
			}
			break
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	type want struct{ name, node string }
	var wants []want
	for _, n := range nodes {
		wants = append(wants, want{"probe-" + n.Name, n.Name})
	}
	wants = append(wants, want{"probe-" + nodes[0].Name + "-b", nodes[0].Name})
	for _, w := range wants {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: w.name, Labels: map[string]string{"app": "weft-check", nameLabel: w.name}},
			Spec: corev1.PodSpec{NodeName: w.node, Containers: []corev1.Container{{
				Name: "workload", Image: lab.WorkloadImage, Ports: []corev1.ContainerPort{{ContainerPort: 80}},
			}}},
		}
		if _, err := c.CoreV1().Pods(Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("creating probe pod %s: %w", w.name, err)
		}
	}
	byName := map[string]lab.Member{}
	for _, n := range nodes {
		byName[n.Name] = n
	}
	deadline, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var eps []endpoint
	for _, w := range wants {
		for {
			p, err := c.CoreV1().Pods(Namespace).Get(deadline, w.name, metav1.GetOptions{})
			if err == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
				nsPath, err := st.PodNetNS(p)
				if err != nil {
					return nil, err
				}
				eps = append(eps, endpoint{name: w.name, ip: net.ParseIP(p.Status.PodIP), node: byName[w.node], nsPath: nsPath})
				break
			}
			select {
			case <-deadline.Done():
				return nil, fmt.Errorf("probe pod %s not running: %w", w.name, deadline.Err())
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return eps, nil
}

// probeHTTP runs one HTTP probe from the namespace at nsPath, retrying for
// up to retry while it fails.
func probeHTTP(ctx context.Context, kind, from string, dial lab.DialFunc, to, url string, want func(workload.Reply) error, retry time.Duration) Result {
	r := Result{Kind: kind, From: from, To: to}
	deadline := time.Now().Add(retry)
	for {
		reply, err := httpGet(ctx, dial, url)
		if err == nil {
			err = want(reply)
		}
		if err == nil {
			r.OK, r.Detail = true, fmt.Sprintf("%s saw %s", reply.Pod, reply.Client)
			return r
		}
		if !time.Now().Before(deadline) {
			r.Detail = err.Error()
			return r
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// addrsIn lists the addresses of the namespace at nsPath.
func addrsIn(nsPath string) (map[string]bool, error) {
	own := map[string]bool{}
	err := netnsutil.Do(nsPath, func() error {
		addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
		for _, a := range addrs {
			own[a.IP.String()] = true
		}
		return err
	})
	return own, err
}

// probeTimeout bounds one probe: a dropped packet must not stall the table.
const probeTimeout = 3 * time.Second

// httpGet asks the workload at url over connections from dial.
func httpGet(ctx context.Context, dial lab.DialFunc, url string) (workload.Reply, error) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	return workload.HTTPGetVia(ctx, dial, url)
}

func httpOK(ctx context.Context, dial lab.DialFunc, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	client := &http.Client{Timeout: probeTimeout, Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return nil
}
