package agent

import (
	"context"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/cni"
	"github.com/weftnet/weft/ipam"
	polipt "github.com/weftnet/weft/policy/iptables"
)

// CNINetwork is the network name of the conflist the agent renders; the
// plugin keeps its allocations under it.
const CNINetwork = "weft"

// podPorts is the iptables pattern of the pods' bridge ports (the host
// side of their veths).
const podPorts = cni.HostVethPrefix + "+"

// podSources reads the CNI plugin's allocations on this node: each pod
// attachment's bridge port and addresses, which the policy rules hold
// the traffic from that port to.
func podSources(dataDir string) ([]polipt.Source, error) {
	dir, err := ipam.NetworkDir(dataDir, CNINetwork)
	if err != nil {
		return nil, err
	}
	store, err := ipam.NewDiskStore(dir)
	if err != nil {
		return nil, fmt.Errorf("opening the ipam state: %w", err)
	}
	var out []polipt.Source
	err = store.View(func(st *ipam.State) error {
		for _, al := range st.Allocations {
			out = append(out, polipt.Source{Port: cni.HostVethName(al.ContainerID, al.IfName), Addrs: al.Addresses})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading the ipam state: %w", err)
	}
	return out, nil
}

// watchAllocations pokes the controller whenever the plugin writes its
// allocation state (ADD, DEL, GC), so that a new pod's source is allowed
// without waiting for the API server to report its address.
func (c *PolicyController) watchAllocations(ctx context.Context) error {
	dir, err := ipam.NetworkDir(c.opts.IPAMDataDir, CNINetwork)
	if err != nil {
		return err
	}
	if _, err := ipam.NewDiskStore(dir); err != nil { // creates the directory
		return err
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("inotify: %w", err)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CLOSE_WRITE|unix.IN_MOVED_TO|unix.IN_CREATE|unix.IN_DELETE); err != nil {
		unix.Close(fd)
		return fmt.Errorf("watching %s: %w", dir, err)
	}
	go func() {
		<-ctx.Done()
		unix.Close(fd) // ends the read below
	}()
	go func() {
		buf := make([]byte, 4096)
		for {
			if _, err := unix.Read(fd, buf); err != nil && err != unix.EINTR {
				return
			}
			c.poke()
		}
	}()
	return nil
}
