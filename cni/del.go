package cni

import (
	"errors"
	"fmt"
	"net"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/ipam"
)

// Del removes one attachment. It is idempotent and succeeds when the pod
// namespace, the veth or the allocation is already gone.
//
// DEL looks up the host side of the pair, asks the node's reaper to delete
// the pair (reap.go), releases the addresses while the reaper works, and
// returns once the pair has left both namespaces, so that the pod
// namespace can take another attachment with the same CNI_IFNAME. The
// kernel's slow part of deleting the pair (15-30 ms of RCU waits) happens
// in the reaper, after DEL. DEL never needs the pod namespace: with the
// namespace already gone, the kernel is destroying the pair, or has.
func Del(args *CmdArgs) error {
	tr := newTracer("DEL", args)
	cfg, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	tr.mark("parse")
	name := HostVethName(args.ContainerID, args.IfName)
	index, err := linkIndex(name)
	if err != nil {
		return err
	}
	tr.mark("netlink")
	reap := startReap(name, index)
	tr.mark("reap-start")
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
	tr.mark("store")
	err = reap.wait()
	tr.mark("reap-wait")
	tr.print()
	return err
}

// hostVeth returns the host-side veth of that name, or nil if there is none.
func hostVeth(name string) (netlink.Link, error) {
	link, err := netlink.LinkByName(name)
	if err != nil {
		if isNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("looking up %s: %w", name, err)
	}
	return link, nil
}

// removeDisarmed deletes the host-side veth of a previous attachment with the
// same (container ID, ifname) if DEL left it disarmed, so that ADD can run
// again, in the same namespace or in a new one.
func removeDisarmed(name string) error {
	link, err := hostVeth(name)
	if link == nil || link.Attrs().Flags&net.FlagUp != 0 {
		return err // none, or an armed attachment ADD will refuse to overwrite
	}
	if err := netlink.LinkDel(link); err != nil && !isNotFound(err) {
		return fmt.Errorf("deleting disarmed %s: %w", name, err)
	}
	return nil
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}
