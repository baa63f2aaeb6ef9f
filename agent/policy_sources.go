package agent

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/cni"
	"github.com/weftnet/weft/ipam"
)

// CNINetwork is the network name of the conflist the agent renders; the
// plugin keeps its allocations under it.
const CNINetwork = "weft"

// podPortPrefix starts the names of the pods' bridge ports (the host side
// of their veths); podPorts is their iptables pattern.
const (
	podPortPrefix = cni.HostVethPrefix
	podPorts      = podPortPrefix + "+"
)

// podAllocations reads the CNI plugin's allocations on this node.
func podAllocations(dataDir string) ([]ipam.Allocation, error) {
	store, err := allocationStore(dataDir)
	if err != nil {
		return nil, err
	}
	var out []ipam.Allocation
	err = store.View(func(st *ipam.State) error {
		out = st.Allocations
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading the ipam state: %w", err)
	}
	return out, nil
}

func allocationStore(dataDir string) (*ipam.DiskStore, error) {
	dir, err := ipam.NetworkDir(dataDir, CNINetwork)
	if err != nil {
		return nil, err
	}
	store, err := ipam.NewDiskStore(dir)
	if err != nil {
		return nil, fmt.Errorf("opening the ipam state: %w", err)
	}
	return store, nil
}

// podSources are the pod attachments' bridge ports and addresses, which
// the policy rules hold the traffic from each port to.
func podSources(allocs []ipam.Allocation) []podSource {
	out := make([]podSource, 0, len(allocs))
	for _, al := range allocs {
		out = append(out, podSource{Port: cni.HostVethName(al.ContainerID, al.IfName), Addrs: al.Addresses})
	}
	return out
}

// watchAllocations pokes the controller whenever the plugin saves its
// allocation state (ADD, DEL, GC), so that a new pod is programmed
// without waiting for the API server to report its address.
func (c *PolicyController) watchAllocations(ctx context.Context) error {
	return watchAllocationSaves(ctx, c.opts.IPAMDataDir, c.allocationsChanged)
}

// watchAllocationSaves calls changed whenever the plugin saves its
// allocation state under dataDir, until ctx ends. Only saves count: the
// lock file is written by every reader too, the agent included.
func watchAllocationSaves(ctx context.Context, dataDir string, changed func()) error {
	store, err := allocationStore(dataDir) // creates the directory
	if err != nil {
		return err
	}
	dir, state := store.Dir(), filepath.Base(store.StatePath())
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
			n, err := unix.Read(fd, buf)
			if err == unix.EINTR {
				continue
			}
			if err != nil || n <= 0 {
				return
			}
			if namesFile(buf[:n], state) {
				changed()
			}
		}
	}()
	return nil
}

// namesFile reports whether a buffer of inotify events names file.
func namesFile(buf []byte, file string) bool {
	for len(buf) >= unix.SizeofInotifyEvent {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[0]))
		end := unix.SizeofInotifyEvent + int(ev.Len)
		if end > len(buf) {
			return false
		}
		if string(bytes.TrimRight(buf[unix.SizeofInotifyEvent:end], "\x00")) == file {
			return true
		}
		buf = buf[end:]
	}
	return false
}
