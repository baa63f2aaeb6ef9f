package cni

import (
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/ipam"
)

// Add wires one pod attachment: addresses, veth pair, bridge port, routes.
func Add(args *CmdArgs) error {
	tr := newTracer("ADD")
	cfg, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	tr.mark("parse")
	pod, err := openPodNS(args.Netns)
	if err != nil {
		return types.NewError(types.ErrInvalidNetNS, "CNI_NETNS: cannot open the pod network namespace", err.Error())
	}
	defer pod.Close()
	if err := removeDisarmed(HostVethName(args.ContainerID, args.IfName)); err != nil {
		return err
	}
	if err := clearRemnant(pod, args.Netns, args.IfName); err != nil {
		return err
	}
	tr.mark("netns")

	store, err := openStore(cfg)
	if err != nil {
		return err
	}
	key := ipam.Key{ContainerID: args.ContainerID, IfName: args.IfName}
	var leases, old []ipam.Lease
	var existed bool
	err = store.Update(func(st *ipam.State) error {
		old, existed = cfg.Pool.Lookup(st, key)
		if leases, err = cfg.Pool.Allocate(st, key); err != nil {
			return err
		}
		st.SetPod(key, podRef(args.Args))
		return revokeReady(old, leases)
	})
	if err != nil {
		if errors.Is(err, ipam.ErrExhausted) {
			return types.NewError(types.ErrTryAgainLater, err.Error(), "network "+cfg.Name)
		}
		return types.NewError(types.ErrIOFailure, "ipam: allocating addresses", err.Error())
	}
	tr.mark("store")

	result, vethCreated, err := wire(cfg, args, pod, leases)
	if err != nil {
		// Undo what this ADD did, in reverse: the veth (its peer goes with
		// it), then the addresses unless an earlier ADD had allocated them.
		if vethCreated {
			if link, lerr := netlink.LinkByName(HostVethName(args.ContainerID, args.IfName)); lerr == nil {
				_ = netlink.LinkDel(link)
			}
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
	if perr := result.print(os.Stdout, cfg.CNIVersion); perr != nil {
		return perr
	}
	tr.mark("result")
	tr.print()
	return nil
}

// wire does the kernel work of ADD and builds the result. It reports whether
// it created the veth pair, so that a failure removes only what ADD made.
func wire(cfg *Config, args *CmdArgs, pod *podNS, leases []ipam.Lease) (_ *Result, vethCreated bool, err error) {
	mtu := cfg.MTU
	if mtu == 0 {
		mtu = defaultMTU()
	}
	br, err := ensureBridge(cfg.Bridge, mtu)
	if err != nil {
		return nil, vethCreated, err
	}
	if err := ensureGateways(br, leases); err != nil {
		return nil, vethCreated, err
	}
	if err := enableForwarding(leases); err != nil {
		return nil, vethCreated, err
	}

	hostName := HostVethName(args.ContainerID, args.IfName)
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: hostName, MTU: mtu, MasterIndex: br.Index, Flags: net.FlagUp, TxQLen: -1},
		PeerName:      args.IfName,
		PeerNamespace: netlink.NsFd(int(pod.fd)),
		PeerTxQLen:    -1,
	}
	if err := netlink.LinkAdd(veth); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return nil, vethCreated, fmt.Errorf("creating veth %s: a link of that name exists (a previous ADD for container %s was not deleted): %w", hostName, args.ContainerID, err)
		}
		return nil, vethCreated, fmt.Errorf("creating veth %s/%s: %w", hostName, args.IfName, err)
	}
	vethCreated = true
	if cfg.Hairpin {
		if err := netlink.LinkSetHairpin(veth, true); err != nil {
			return nil, vethCreated, fmt.Errorf("enabling hairpin on %s: %w", hostName, err)
		}
	}
	hostLink, err := netlink.LinkByName(hostName)
	if err != nil {
		return nil, vethCreated, fmt.Errorf("looking up %s: %w", hostName, err)
	}

	podLink, err := configurePod(cfg, args.IfName, pod, leases)
	if err != nil {
		return nil, vethCreated, err
	}
	if err := announce(br, podLink.Attrs().HardwareAddr, leases); err != nil {
		return nil, vethCreated, err
	}

	result := &Result{
		Interfaces: []*Interface{
			{Name: br.Name, Mac: br.HardwareAddr.String()},
			{Name: hostName, Mac: hostLink.Attrs().HardwareAddr.String()},
			{Name: args.IfName, Mac: podLink.Attrs().HardwareAddr.String(), Mtu: mtu, Sandbox: args.Netns},
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

// configurePod brings the pod's interface up with its addresses and routes.
func configurePod(cfg *Config, ifName string, pod *podNS, leases []ipam.Lease) (netlink.Link, error) {
	h := pod.handle
	link, err := h.LinkByName(ifName)
	if err != nil {
		return nil, fmt.Errorf("looking up %s in the pod: %w", ifName, err)
	}
	for _, l := range leases {
		addr := &netlink.Addr{IPNet: ipNet(l.Address)}
		if l.Address.Addr().Is6() {
			// The allocator guarantees uniqueness; skipping DAD saves ~1 s.
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := h.AddrAdd(link, addr); err != nil {
			return nil, fmt.Errorf("adding %s to %s in the pod: %w", l.Address, ifName, err)
		}
	}
	if err := h.LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("setting %s up in the pod: %w", ifName, err)
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
		route := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: &r.Dst, Gw: gw}
		if err := h.RouteAdd(route); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("adding route %s via %s in the pod: %w", r.Dst.String(), gw, err)
		}
	}
	return link, nil
}

// announce tells the node the pod's MAC for each of its addresses. Besides
// saving the first packet a neighbour lookup, this matters for services:
// with bridge netfilter, a packet DNATed to a pod on the same bridge is
// switched straight to the pod's port, and for IPv6 the kernel needs the
// pod's neighbour entry for that (without one the packet is lost). The
// entry is REACHABLE, not permanent: the kernel revalidates and ages it,
// and the next ADD that reuses the address replaces it.
func announce(br *netlink.Bridge, mac net.HardwareAddr, leases []ipam.Lease) error {
	for _, l := range leases {
		family := netlink.FAMILY_V4
		if l.Address.Addr().Is6() {
			family = netlink.FAMILY_V6
		}
		n := &netlink.Neigh{LinkIndex: br.Index, Family: family, State: netlink.NUD_REACHABLE,
			IP: net.IP(l.Address.Addr().AsSlice()), HardwareAddr: mac}
		if err := netlink.NeighSet(n); err != nil {
			return fmt.Errorf("neighbour entry for %s: %w", l.Address.Addr(), err)
		}
	}
	return nil
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
