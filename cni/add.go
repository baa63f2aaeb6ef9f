package cni

import (
	"errors"
	"fmt"
	"net"

	"github.com/containernetworking/cni/pkg/types"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/ipam"
	"github.com/weftnet/weft/policy/readyset"
)

// Add wires one pod attachment: addresses, veth pair, bridge port, routes.
func Add(args *CmdArgs) error {
	tr := newTracer("ADD", args)
	cfg, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	tr.mark("parse")
	podNS, err := openNetNS(args.Netns)
	if err != nil {
		return types.NewError(types.ErrInvalidNetNS, "CNI_NETNS: cannot open the pod network namespace", err.Error())
	}
	defer podNS.Close()
	pod, err := openRTNL(int(podNS))
	if err != nil {
		return types.NewError(types.ErrInvalidNetNS, "CNI_NETNS: cannot open the pod network namespace", err.Error())
	}
	defer pod.close()
	host, err := openRTNL(-1)
	if err != nil {
		return err
	}
	defer host.close()
	tr.mark("netns")

	store, err := openStore(cfg)
	if err != nil {
		return err
	}
	// Opened before the node-wide lock, used under it.
	revoker, err := readyset.OpenRevoker()
	if err != nil {
		return types.NewError(types.ErrIOFailure, "ipam: revoking NetworkPolicy readiness", err.Error())
	}
	defer revoker.Close()
	key := ipam.Key{ContainerID: args.ContainerID, IfName: args.IfName}
	var leases, old []ipam.Lease
	var existed bool
	err = store.Update(func(st *ipam.State) error {
		old, existed = cfg.Pool.Lookup(st, key)
		if leases, err = cfg.Pool.Allocate(st, key); err != nil {
			return err
		}
		st.SetPod(key, podRef(args.Args))
		return revokeReady(revoker, old, leases)
	})
	if err != nil {
		if errors.Is(err, ipam.ErrExhausted) {
			return types.NewError(types.ErrTryAgainLater, err.Error(), "network "+cfg.Name)
		}
		return types.NewError(types.ErrIOFailure, "ipam: allocating addresses", err.Error())
	}
	tr.mark("store")

	result, vethCreated, err := wire(cfg, args, host, pod, int(podNS), leases)
	if err != nil {
		// Undo what this ADD did, in reverse: the veth (its peer goes with
		// it), then the addresses unless an earlier ADD had allocated them.
		if vethCreated {
			_ = host.run(nlreq{what: "deleting the veth", msg: delLinkMsg(HostVethName(args.ContainerID, args.IfName))})
		}
		if !existed {
			_ = store.Update(func(st *ipam.State) error {
				cfg.Pool.Release(st, key)
				return nil
			})
		}
		return err
	}
	tr.mark("netlink")
	if perr := result.print(args.Stdout, cfg.CNIVersion); perr != nil {
		return perr
	}
	tr.mark("result")
	tr.print()
	return nil
}

// wire does the kernel work of ADD and builds the result. It reports whether
// it created the veth pair, so that a failure removes only what ADD made.
// host and pod are rtnetlink sockets in the node's and the pod's namespace,
// podNS the pod namespace's descriptor.
func wire(cfg *Config, args *CmdArgs, host, pod *rtnl, podNS int, leases []ipam.Lease) (_ *Result, vethCreated bool, err error) {
	mtu := cfg.MTU
	if mtu == 0 {
		mtu = defaultMTU()
	}
	br, err := nodeBridge(host, cfg.Bridge, mtu, leases)
	if err != nil {
		return nil, vethCreated, err
	}
	if err := enableForwarding(leases); err != nil {
		return nil, vethCreated, err
	}

	hostName := HostVethName(args.ContainerID, args.IfName)
	podMAC, err := randomMAC()
	if err != nil {
		return nil, vethCreated, err
	}
	hostLink, err := createVeth(host, args, hostName, vethMsg(hostName, args.IfName, mtu, br.index, podNS, podMAC))
	if err != nil {
		return nil, vethCreated, err
	}
	vethCreated = true

	// The node side: hairpin on the bridge port, the pod's neighbour
	// entries on the bridge; then the pod side: its interface up, its
	// addresses, then its routes (a gateway must be on-link).
	var reqs []nlreq
	if cfg.Hairpin {
		reqs = append(reqs, nlreq{what: "enabling hairpin on " + hostName, msg: hairpinMsg(hostLink.index)})
	}
	reqs = append(reqs, announce(br.index, podMAC, leases)...)
	if err := host.run(reqs...); err != nil {
		return nil, vethCreated, err
	}
	if err := pod.run(configurePod(cfg, args.IfName, hostLink.peer, leases)...); err != nil {
		return nil, vethCreated, err
	}

	result := &Result{
		Interfaces: []*Interface{
			{Name: br.name, Mac: br.mac.String()},
			{Name: hostName, Mac: hostLink.mac.String()},
			{Name: args.IfName, Mac: podMAC.String(), Mtu: mtu, Sandbox: args.Netns},
		},
		DNS: cfg.DNS,
	}
	podIndex := 2
	for _, l := range leases {
		result.IPs = append(result.IPs, &IPConfig{
			Interface: &podIndex,
			Address:   types.IPNet(*ipNet(l.Address)),
			Gateway:   net.IP(l.Gateway.AsSlice()),
		})
		result.Routes = append(result.Routes, defaultRoute(l))
	}
	result.Routes = append(result.Routes, cfg.IPAM.Routes...)
	return result, true, nil
}

// createVeth sends create (the veth pair) and looks the host side up in the
// same batch. A name already taken, on the node or in the pod, is cleared
// if it is what a deleted attachment left disarmed, and the creation is
// tried once more; otherwise it is an error naming the taken name.
func createVeth(host *rtnl, args *CmdArgs, hostName string, create *nlmsg) (rtLink, error) {
	for attempt := 0; ; attempt++ {
		var link rtLink
		var perr error
		errs, err := host.exchange(func(i int, typ uint16, body []byte) {
			if i == 1 && typ == unix.RTM_NEWLINK {
				link, perr = parseLink(body)
			}
		}, create, getLinkMsg(hostName))
		switch {
		case err != nil:
			return rtLink{}, fmt.Errorf("creating veth %s/%s: %w", hostName, args.IfName, err)
		case errs[0] == nil && errs[1] == nil && perr == nil:
			return link, nil
		case errs[0] == nil:
			return rtLink{}, fmt.Errorf("looking up %s: %w", hostName, errors.Join(errs[1], perr))
		case !errors.Is(errs[0], unix.EEXIST):
			return rtLink{}, fmt.Errorf("creating veth %s/%s: %w", hostName, args.IfName, errs[0])
		case attempt > 0:
			return rtLink{}, fmt.Errorf("creating veth %s: a link of that name exists (a previous ADD for container %s was not deleted): %w", hostName, args.ContainerID, errs[0])
		}
		if err := clearNames(args, hostName); err != nil {
			return rtLink{}, err
		}
	}
}

// clearNames makes way for a veth pair whose creation found a name taken:
// the host side of a disarmed pair of the same attachment, or the pod side
// of a disarmed weft pair in the pod (left by a DEL that died before the
// pair was gone, or by a weft version whose DEL left the pair to the
// kernel), is deleted. Any other holder of CNI_IFNAME in the pod is an
// error.
func clearNames(args *CmdArgs, hostName string) error {
	if err := removeDisarmed(hostName); err != nil {
		return err
	}
	pod, err := openPodNS(args.Netns)
	if err != nil {
		return types.NewError(types.ErrInvalidNetNS, "CNI_NETNS: cannot open the pod network namespace", err.Error())
	}
	defer pod.Close()
	return clearRemnant(pod, args.Netns, args.IfName)
}

// configurePod returns the requests that bring the pod's interface (index
// idx in the pod) up with its addresses and routes.
func configurePod(cfg *Config, ifName string, idx int, leases []ipam.Lease) []nlreq {
	reqs := []nlreq{{what: "setting " + ifName + " up in the pod", msg: linkUpMsg(idx)}}
	for _, l := range leases {
		reqs = append(reqs, nlreq{what: fmt.Sprintf("adding %s to %s in the pod", l.Address, ifName), msg: addrMsg(idx, l.Address)})
	}
	routes := make([]*types.Route, 0, len(leases)+len(cfg.IPAM.Routes))
	for _, l := range leases {
		routes = append(routes, defaultRoute(l))
	}
	routes = append(routes, cfg.IPAM.Routes...)
	for _, r := range routes {
		gw := r.GW
		if gw == nil {
			gw = gatewayFor(leases, r.Dst.IP)
		}
		reqs = append(reqs, nlreq{what: fmt.Sprintf("adding route %s via %s in the pod", r.Dst.String(), gw), msg: routeMsg(idx, r.Dst, gw), ignore: unix.EEXIST})
	}
	return reqs
}

// announce returns the requests that tell the node the pod's MAC for each
// of its addresses, on the bridge (index bridge). Besides
// saving the first packet a neighbour lookup, this matters for services:
// with bridge netfilter, a packet DNATed to a pod on the same bridge is
// switched straight to the pod's port, and for IPv6 the kernel needs the
// pod's neighbour entry for that (without one the packet is lost). The
// entry is REACHABLE, not permanent: the kernel revalidates and ages it,
// and the next ADD that reuses the address replaces it.
func announce(bridge int, mac net.HardwareAddr, leases []ipam.Lease) []nlreq {
	reqs := make([]nlreq, len(leases))
	for i, l := range leases {
		reqs[i] = nlreq{what: fmt.Sprintf("neighbour entry for %s", l.Address.Addr()), msg: neighMsg(bridge, l.Address.Addr(), mac)}
	}
	return reqs
}

func defaultRoute(l ipam.Lease) *types.Route {
	bits := l.Gateway.BitLen()
	dst := net.IPNet{IP: make(net.IP, bits/8), Mask: net.CIDRMask(0, bits)}
	return &types.Route{Dst: dst, GW: net.IP(l.Gateway.AsSlice())}
}

// gatewayFor picks the gateway of the family of ip.
func gatewayFor(leases []ipam.Lease, ip net.IP) net.IP {
	v4 := ip.To4() != nil
	for _, l := range leases {
		if l.Gateway.Is4() == v4 {
			return net.IP(l.Gateway.AsSlice())
		}
	}
	return nil
}
