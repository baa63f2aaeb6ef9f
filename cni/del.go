package cni

import (
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/ipam"
)

// Del removes one attachment. It is idempotent and succeeds when the pod
// namespace, the veth or the allocation is already gone.
func Del(args *skel.CmdArgs) error {
	cfg, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	// The kernel first: once the address is released it may be handed to
	// another pod, so the old interface must not hold it any more.
	if args.Netns != "" {
		if err := delPodLink(args.Netns, args.IfName); err != nil {
			return err
		}
	}
	if err := delHostVeth(HostVethName(args.ContainerID, args.IfName)); err != nil {
		return err
	}
	store, err := openStore(cfg)
	if err != nil {
		return err
	}
	key := ipam.Key{ContainerID: args.ContainerID, IfName: args.IfName}
	if err := store.Update(func(st *ipam.State) error {
		cfg.Pool.Release(st, key)
		return nil
	}); err != nil {
		return types.NewError(types.ErrIOFailure, "ipam: releasing addresses", err.Error())
	}
	return nil
}

// delPodLink deletes the pod's interface (and so its veth peer).
func delPodLink(path, ifName string) error {
	pod, err := openPodNS(path)
	if errors.Is(err, errNetNSGone) {
		return nil
	}
	if err != nil {
		return err
	}
	defer pod.Close()
	link, err := pod.handle.LinkByName(ifName)
	if err != nil {
		if isNotFound(err) {
			return nil
		}
		return fmt.Errorf("looking up %s in the pod: %w", ifName, err)
	}
	if err := pod.handle.LinkDel(link); err != nil && !isNotFound(err) {
		return fmt.Errorf("deleting %s in the pod: %w", ifName, err)
	}
	return nil
}

// delHostVeth deletes a host-side veth if it is still there.
func delHostVeth(name string) error {
	link, err := netlink.LinkByName(name)
	if err != nil {
		if isNotFound(err) {
			return nil
		}
		return fmt.Errorf("looking up %s: %w", name, err)
	}
	if err := netlink.LinkDel(link); err != nil && !isNotFound(err) {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}
