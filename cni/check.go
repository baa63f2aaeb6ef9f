package cni

import (
	"fmt"
	"net"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"

	"github.com/weftnet/weft/internal/nlutil"
	"github.com/weftnet/weft/ipam"
)

// Check verifies that the attachment still looks as ADD left it.
func Check(args *CmdArgs) error {
	cfg, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	prev := cfg.Prev
	if prev == nil {
		return types.NewError(types.ErrInvalidNetworkConfig, "prevResult: required for CHECK", "")
	}
	if err := checkAllocation(cfg, args, prev); err != nil {
		return err
	}
	if err := checkHostVeth(cfg, HostVethName(args.ContainerID, args.IfName)); err != nil {
		return err
	}
	pod, err := openPodNS(args.Netns)
	if err != nil {
		return types.NewError(types.ErrInvalidNetNS, "CNI_NETNS: cannot open the pod network namespace", err.Error())
	}
	defer pod.Close()
	return checkPod(pod, args.IfName, prev)
}

func checkAllocation(cfg *Config, args *CmdArgs, prev *Result) error {
	store, err := openStore(cfg)
	if err != nil {
		return err
	}
	var leases []ipam.Lease
	var ok bool
	if err := store.View(func(st *ipam.State) error {
		leases, ok = cfg.Pool.Lookup(st, ipam.Key{ContainerID: args.ContainerID, IfName: args.IfName})
		return nil
	}); err != nil {
		return types.NewError(types.ErrIOFailure, "ipam: reading the allocation store", err.Error())
	}
	if !ok {
		return fmt.Errorf("ipam: no allocation for container %s interface %s", args.ContainerID, args.IfName)
	}
	for _, l := range leases {
		if !prevHasIP(prev, ipNet(l.Address)) {
			return fmt.Errorf("ipam: allocated %s is not in prevResult", l.Address)
		}
	}
	return nil
}

func checkHostVeth(cfg *Config, name string) error {
	link, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("host veth %s: %w", name, err)
	}
	br, err := netlink.LinkByName(cfg.Bridge)
	if err != nil {
		return fmt.Errorf("bridge %s: %w", cfg.Bridge, err)
	}
	if link.Attrs().MasterIndex != br.Attrs().Index {
		return fmt.Errorf("host veth %s is not attached to bridge %s", name, cfg.Bridge)
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		return fmt.Errorf("host veth %s is down (the attachment was deleted)", name)
	}
	return nil
}

func checkPod(pod *podNS, ifName string, prev *Result) error {
	h := pod.handle
	idx := -1
	for i, iface := range prev.Interfaces {
		if iface.Name == ifName && iface.Sandbox != "" {
			idx = i
		}
	}
	if idx < 0 {
		return fmt.Errorf("prevResult: no sandbox interface named %s", ifName)
	}
	link, err := h.LinkByName(ifName)
	if err != nil {
		return fmt.Errorf("interface %s in the pod: %w", ifName, err)
	}
	if want := prev.Interfaces[idx].Mac; want != "" && link.Attrs().HardwareAddr.String() != want {
		return fmt.Errorf("interface %s in the pod has MAC %s, prevResult says %s", ifName, link.Attrs().HardwareAddr, want)
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		return fmt.Errorf("interface %s in the pod is down", ifName)
	}
	addrs, err := nlutil.Dump("addresses of "+ifName+" in the pod", func() ([]netlink.Addr, error) { return h.AddrList(link, netlink.FAMILY_ALL) })
	if err != nil {
		return err
	}
	for _, ipc := range prev.IPs {
		if ipc.Interface == nil || *ipc.Interface != idx {
			continue
		}
		want := (*net.IPNet)(&ipc.Address)
		if !hasAddr(addrs, want) {
			return fmt.Errorf("address %s is missing from %s in the pod", want, ifName)
		}
	}
	routes, err := nlutil.Dump("routes in the pod", func() ([]netlink.Route, error) { return h.RouteList(link, netlink.FAMILY_ALL) })
	if err != nil {
		return err
	}
	for _, want := range prev.Routes {
		if !hasRoute(routes, want) {
			return fmt.Errorf("route %s via %s is missing in the pod", want.Dst.String(), want.GW)
		}
	}
	return nil
}

func prevHasIP(prev *Result, want *net.IPNet) bool {
	for _, ipc := range prev.IPs {
		if ipc.Address.IP.Equal(want.IP) && ipc.Address.Mask.String() == want.Mask.String() {
			return true
		}
	}
	return false
}

func hasAddr(addrs []netlink.Addr, want *net.IPNet) bool {
	for _, a := range addrs {
		if a.IP.Equal(want.IP) && a.Mask.String() == want.Mask.String() {
			return true
		}
	}
	return false
}

func hasRoute(routes []netlink.Route, want *types.Route) bool {
	wantOnes, _ := want.Dst.Mask.Size()
	for _, r := range routes {
		ones := 0
		var dstIP net.IP
		if r.Dst != nil {
			ones, _ = r.Dst.Mask.Size()
			dstIP = r.Dst.IP
		}
		if ones != wantOnes {
			continue
		}
		if dstIP != nil && !dstIP.Equal(want.Dst.IP) {
			continue
		}
		if dstIP == nil && !want.Dst.IP.IsUnspecified() {
			continue
		}
		if want.GW != nil && !r.Gw.Equal(want.GW) {
			continue
		}
		return true
	}
	return false
}
