package cni

import (
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// podNS is an open pod network namespace and a netlink handle inside it.
type podNS struct {
	fd     netns.NsHandle
	handle *netlink.Handle
}

// openPodNS opens the namespace at path and an rtnetlink socket inside it.
func openPodNS(path string) (*podNS, error) {
	fd, err := openNetNS(path)
	if err != nil {
		return nil, err
	}
	// Only rtnetlink: a handle for every family costs a socket and two
	// namespace switches each.
	h, err := netlink.NewHandleAt(fd, unix.NETLINK_ROUTE)
	if err != nil {
		fd.Close()
		return nil, fmt.Errorf("netlink socket in %s: %w", path, err)
	}
	return &podNS{fd: fd, handle: h}, nil
}

// openNetNS opens the network namespace at path, making sure it is one.
func openNetNS(path string) (netns.NsHandle, error) {
	fd, err := netns.GetFromPath(path)
	if err != nil {
		return -1, fmt.Errorf("opening %s: %w", path, err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(fd), &st); err != nil {
		fd.Close()
		return -1, fmt.Errorf("statfs %s: %w", path, err)
	}
	// A bind-mounted namespace lives on nsfs; /proc/<pid>/ns/net on procfs.
	if st.Type != unix.NSFS_MAGIC && st.Type != unix.PROC_SUPER_MAGIC {
		fd.Close()
		return -1, fmt.Errorf("%s is not a network namespace", path)
	}
	return fd, nil
}

func (p *podNS) Close() {
	p.handle.Close()
	p.fd.Close()
}
