// Command weftctl is weft's operator CLI. Today it runs the lab:
//
//	weftctl lab up [--nodes N] [--routing hostgw|vxlan|bgp] [--racks N] [--proxy-mode MODE] [--dataplane iptables|nftables] [--dir DIR]
//	weftctl lab status [--dir DIR]
//	weftctl lab exec [--dir DIR] NODE|POD -- CMD [ARGS...]
//	weftctl lab down [--dir DIR]
//	weftctl check [--dir DIR] [--keep]
//	weftctl why [--kubeconfig FILE] [--dir DIR] FROM TO PORT[/PROTO]
//	weftctl install-cni [--from DIR] [--to DIR] [--replace weft-plugin,weft]
//	weftctl sysctl NAME=VALUE...
package main

import (
	"fmt"
	"os"

	"github.com/weftnet/weft/internal/iptmode"
	"github.com/weftnet/weft/internal/netnsutil"
)

const usage = `usage: weftctl lab up|down|status|exec ... | weftctl check ... | weftctl why ... | weftctl install-cni ... | weftctl sysctl ...

  lab up      [--nodes N] [--routing hostgw|vxlan|bgp] [--racks N] [--proxy-mode iptables|nftables|ebpf]
              [--dataplane iptables|nftables] [--dual-stack] [--pod-cidr-size N] [--dir DIR] [--api-port PORT]
  lab down    [--dir DIR]
  lab status  [--dir DIR]
  lab exec    [--dir DIR] NODE|POD -- CMD [ARGS...]   run CMD in the network namespace of a
              node (or cp, ext) or of a pod (NAME or NAMESPACE/NAME)
  check       [--dir DIR] [--keep]   connectivity test on the lab
  why         [--kubeconfig FILE] [--dir DIR] FROM TO PORT[/PROTO]   the verdict of the cluster's
              NetworkPolicies and ClusterNetworkPolicies on a connection (FROM, TO: NAMESPACE/POD
              or an address), and what decided it
  install-cni [--from DIR] [--to DIR] [--replace weft-plugin,weft]   install the image's CNI plugins
              on the node (the weft-agent DaemonSet's init container)
  sysctl      NAME=VALUE...   set kernel settings unless set already (the weft-agent
              DaemonSet's privileged init container)
`

func main() {
	// weftctl check dials from lab pods through helpers of itself.
	netnsutil.ServeDialHelper()
	// In weft's image every iptables name links here (internal/iptmode).
	if iptmode.IsName(os.Args[0]) {
		err := iptmode.Wrap(os.Args)
		fmt.Fprintln(os.Stderr, "weft iptables wrapper:", err)
		os.Exit(1)
	}
	top := map[string]func([]string) error{"check": runCheck, "why": runWhy, "install-cni": installCNI, "sysctl": setSysctls}
	if len(os.Args) >= 2 && top[os.Args[1]] != nil {
		if err := top[os.Args[1]](os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "weftctl "+os.Args[1]+":", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) < 3 || os.Args[1] != "lab" {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	cmds := map[string]func([]string) error{
		"up": labUp, "down": labDown, "status": labStatus, "exec": labExec, "forward": labForward, "node-ns": labNodeNS, "lb": labLB,
	}
	run, ok := cmds[os.Args[2]]
	if !ok {
		fmt.Fprintf(os.Stderr, "weftctl lab: unknown command %q\n%s", os.Args[2], usage)
		os.Exit(2)
	}
	if err := run(os.Args[3:]); err != nil {
		fmt.Fprintln(os.Stderr, "weftctl lab "+os.Args[2]+":", err)
		os.Exit(1)
	}
}
