package cni

import (
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"

	"github.com/weftnet/weft/internal/nlutil"
	"github.com/weftnet/weft/ipam"
)

// ErrPluginNotAvailable is the CNI 1.1 STATUS code for "cannot serve ADDs".
const ErrPluginNotAvailable uint = 50

// Status reports whether the plugin can serve an ADD now: its state must be
// readable and every range set must have a free address.
func Status(args *CmdArgs) error {
	cfg, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	store, err := openStore(cfg)
	if err != nil {
		return types.NewError(ErrPluginNotAvailable, "ipam: allocation store unavailable", err.Error())
	}
	var free []uint64
	if err := store.View(func(st *ipam.State) error {
		free = cfg.Pool.Free(st)
		return nil
	}); err != nil {
		return types.NewError(ErrPluginNotAvailable, "ipam: allocation store unreadable", err.Error())
	}
	for i, n := range free {
		if n == 0 {
			return types.NewError(ErrPluginNotAvailable,
				fmt.Sprintf("ipam.ranges[%d]: no free address", i), "network "+cfg.Name)
		}
	}
	return nil
}

// GC releases every allocation, and removes every host-side veth on the
// bridge, that does not belong to an attachment in cni.dev/valid-attachments.
// It works from the plugin's own state, not from the runtime's cache.
func GC(args *CmdArgs) error {
	cfg, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	valid := make(map[ipam.Key]bool, len(cfg.ValidAttachments))
	validVeth := make(map[string]bool, len(cfg.ValidAttachments))
	for _, a := range cfg.ValidAttachments {
		valid[ipam.Key{ContainerID: a.ContainerID, IfName: a.IfName}] = true
		validVeth[HostVethName(a.ContainerID, a.IfName)] = true
	}

	// Veths first, as in DEL: an address is free only once no link holds it.
	var errs []error
	if br, err := netlink.LinkByName(cfg.Bridge); err == nil {
		links, err := nlutil.Dump("links", netlink.LinkList)
		if err != nil {
			return err
		}
		for _, l := range links {
			a := l.Attrs()
			if a.MasterIndex != br.Attrs().Index || l.Type() != "veth" || !isHostVethName(a.Name) || validVeth[a.Name] {
				continue
			}
			if err := netlink.LinkDel(l); err != nil && !isNotFound(err) {
				errs = append(errs, fmt.Errorf("deleting stale veth %s: %w", a.Name, err))
			}
		}
	} else if !isNotFound(err) {
		return fmt.Errorf("looking up bridge %s: %w", cfg.Bridge, err)
	}

	store, err := openStore(cfg)
	if err != nil {
		return err
	}
	if err := store.Update(func(st *ipam.State) error {
		for _, k := range st.Keys() {
			if !valid[k] {
				cfg.Pool.Release(st, k)
			}
		}
		return nil
	}); err != nil {
		errs = append(errs, types.NewError(types.ErrIOFailure, "ipam: releasing stale allocations", err.Error()))
	}
	return errors.Join(errs...)
}
