package cni

import (
	"errors"
	"fmt"
	"net"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/ipam"
)

// Del removes one attachment. It is idempotent and succeeds when the pod
// namespace, the veth or the allocation is already gone.
//
// DEL disarms the veth pair rather than deleting it: the host side goes down,
// which cuts the pod off (veth drops what the pod sends, the bridge forwards
// nothing to a disabled port), and only then is the address released. The
// pair itself is destroyed by the kernel together with the pod's namespace,
// which the runtime removes right after DEL and which the kernel tears down
// in batches; the next ADD or GC for a disarmed pair deletes it otherwise.
// Unregistering a veth synchronously costs 15-40 ms under the global RTNL
// lock, stalling every other pod's ADD on the node.
func Del(args *skel.CmdArgs) error {
	cfg, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	if err := disarmHostVeth(HostVethName(args.ContainerID, args.IfName)); err != nil {
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

// disarmHostVeth sets a host-side veth down if it is still there.
func disarmHostVeth(name string) error {
	link, err := hostVeth(name)
	if link == nil || link.Attrs().Flags&net.FlagUp == 0 {
		return err
	}
	if err := netlink.LinkSetDown(link); err != nil && !isNotFound(err) {
		return fmt.Errorf("setting %s down: %w", name, err)
	}
	return nil
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
