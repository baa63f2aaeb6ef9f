package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/lab"
)

func newFlags(name string) (*flag.FlagSet, *string) {
	fs := flag.NewFlagSet("weftctl lab "+name, flag.ContinueOnError)
	dir := fs.String("dir", lab.DefaultDir, "lab state directory")
	return fs, dir
}

func labUp(args []string) error {
	fs, dir := newFlags("up")
	nodes := fs.Int("nodes", 3, "number of nodes")
	routing := fs.String("routing", "hostgw", "cross-node routing: hostgw, vxlan or bgp")
	racks := fs.Int("racks", 0, "put the nodes on that many racks (subnets) behind a BGP top-of-rack router; 0 or 1: one segment")
	zones := fs.Int("zones", 0, "spread the nodes over that many zones (0: each node its own; with racks, each rack one)")
	proxyMode := fs.String("proxy-mode", "", "the agents' service proxy: "+strings.Join(lab.ProxyModes, ", ")+" (default: nftables with --dataplane nftables, else iptables)")
	dataplane := fs.String("dataplane", "", "where the agents' packet rules live: "+strings.Join(lab.Dataplanes, ", ")+" (default: nftables with --proxy-mode nftables, else iptables)")
	dualStack := fs.Bool("dual-stack", false, "IPv6 beside IPv4: underlay, node addresses, podCIDRs ("+lab.ClusterCIDR6+") and Services ("+lab.ServiceCIDR6+"); one segment only")
	podCIDRSize := fs.Int("pod-cidr-size", lab.DefaultPodCIDRSize, "prefix length of each node's podCIDR, within the cluster's "+lab.ClusterCIDR)
	apiPort := fs.Int("api-port", 6443, "port of the API server on the host's loopback")
	encryption := fs.String("encryption", "none", "encryption of pod traffic between nodes: none or wireguard (userspace WireGuard where the kernel has none)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return lab.Up(ctx, lab.Options{
		Nodes: *nodes, Routing: *routing, Racks: *racks, Zones: *zones, ProxyMode: *proxyMode, Dataplane: *dataplane, DualStack: *dualStack, PodCIDRSize: *podCIDRSize, Encryption: *encryption, Dir: *dir, BinDir: filepath.Dir(self), APIPort: *apiPort, Out: os.Stdout,
	})
}

func labDown(args []string) error {
	fs, dir := newFlags("down")
	if err := fs.Parse(args); err != nil {
		return err
	}
	return lab.Down(*dir)
}

func labStatus(args []string) error {
	fs, dir := newFlags("status")
	if err := fs.Parse(args); err != nil {
		return err
	}
	st, err := lab.Load(*dir)
	if err != nil {
		return err
	}
	fmt.Printf("lab in %s: %d nodes, routing %s, up since %s\nKUBECONFIG=%s\n\n",
		*dir, st.Nodes, st.Routing, st.Started.Format("15:04:05"), lab.AdminKubeconfig(*dir))
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "MEMBER\tNAMESPACE\tADDRESS")
	for _, m := range st.Members {
		fmt.Fprintf(w, "%s\t%s\t%s\n", m.Name, m.NS, m.IP)
	}
	fmt.Fprintln(w, "\nPROCESS\tPID\tSTATE\tLOG")
	down := 0
	for _, p := range lab.Procs(*dir) {
		state := "running"
		if !p.Running {
			state, down = "DEAD", down+1
		}
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\n", p.Name, p.PID, state, p.Log)
	}
	w.Flush()
	if down > 0 {
		return fmt.Errorf("%d lab processes are not running", down)
	}
	return nil
}

func labExec(args []string) error {
	fs, dir := newFlags("exec")
	if err := fs.Parse(args); err != nil {
		return err
	}
	rest := fs.Args()
	if len(rest) < 3 || rest[1] != "--" {
		return errors.New("usage: weftctl lab exec [--dir DIR] NODE|POD -- CMD [ARGS...]")
	}
	st, err := lab.Load(*dir)
	if err != nil {
		return err
	}
	path, err := memberOrPodNS(*dir, st, rest[0])
	if err != nil {
		return err
	}
	cmd := exec.Command(rest[2], rest[3:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), "KUBECONFIG="+lab.AdminKubeconfig(*dir))
	err = netnsutil.Do(path, cmd.Run)
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		os.Exit(exit.ExitCode())
	}
	return err
}

// memberOrPodNS finds the namespace of a lab member (node, cp, ext) or of a
// pod, named NAME (namespace default) or NAMESPACE/NAME.
func memberOrPodNS(dir string, st *lab.State, name string) (string, error) {
	for _, m := range st.Members {
		if m.Name == name {
			return m.NSPath(), nil
		}
	}
	ns, pod := "default", name
	if i := strings.IndexByte(name, '/'); i >= 0 {
		ns, pod = name[:i], name[i+1:]
	}
	c, err := lab.Client(lab.AdminKubeconfig(dir))
	if err != nil {
		return "", err
	}
	p, err := c.CoreV1().Pods(ns).Get(context.Background(), pod, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("%q is neither a lab member nor a pod: %w", name, err)
	}
	return st.PodNetNS(p)
}

// labLB is the lab's load balancer daemon (started by lab up, see lab.RunLB).
func labLB(args []string) error {
	fs := flag.NewFlagSet("weftctl lab lb", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "the lab's admin kubeconfig")
	pool := fs.String("pool", lab.LBPool.String(), "load-balancer addresses")
	route := fs.Bool("route", false, "route the addresses to the nodes from this process's network namespace")
	src := fs.String("src", "", "with --route: the routes' preferred source address, added to the loopback")
	if err := fs.Parse(args); err != nil {
		return err
	}
	p, err := netip.ParsePrefix(*pool)
	if err != nil {
		return fmt.Errorf("--pool: %w", err)
	}
	var srcIP netip.Addr
	if *src != "" {
		if srcIP, err = netip.ParseAddr(*src); err != nil {
			return fmt.Errorf("--src: %w", err)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return lab.RunLB(ctx, lab.LBOptions{Kubeconfig: *kubeconfig, Pool: p, Route: *route, Src: srcIP, Log: slog.New(slog.NewTextHandler(os.Stderr, nil))})
}

// labForward is the lab's API forwarder daemon (started by lab up).
func labForward(args []string) error {
	fs := flag.NewFlagSet("weftctl lab forward", flag.ContinueOnError)
	ns := fs.String("ns", "", "namespace to dial from")
	listen := fs.String("listen", "", "address to listen on (host loopback)")
	to := fs.String("to", "", "address to dial inside the namespace")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	dial := netnsutil.Dialer(*ns, nil)
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			up, err := dial(context.Background(), "tcp", *to)
			if err != nil {
				fmt.Fprintln(os.Stderr, "forward:", err)
				return
			}
			defer up.Close()
			done := make(chan struct{}, 2)
			pipe := func(dst, src net.Conn) {
				_, _ = io.Copy(dst, src)
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
				done <- struct{}{}
			}
			go pipe(up, c)
			go pipe(c, up)
			<-done
			<-done
		}()
	}
}

// labNodeNS holds a real node's mount namespace (started by lab up).
func labNodeNS(args []string) error {
	fs, dir := newFlags("node-ns")
	node := fs.String("node", "", "node name")
	if err := fs.Parse(args); err != nil {
		return err
	}
	st, err := lab.Load(*dir)
	if err != nil {
		return err
	}
	return lab.NodeNamespace(st.Options, *node)
}
