package cni

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ReapArg is the first argument with which the plugin binary runs as the
// node's reaper (reaper.go) instead of serving a CNI command:
// `weft reap-veth <host veth name>`.
const ReapArg = "reap-veth"

// reapTimeout bounds how long DEL waits for the reaper before it deletes
// the pair itself.
const reapTimeout = 5 * time.Second

// Design note: taking the pod side out of the pod namespace.
//
// After DEL the pod namespace must not hold weft's interface any more: the
// runtime may run ADD for another container into the same namespace and
// CNI_IFNAME. Deleting a veth pair (or moving one end to another namespace)
// is a synchronous netlink request that returns only after the kernel has
// waited for RCU grace periods and for the last references to the devices:
// 20-30 ms on the reference machines, almost all of it spent waiting, little
// of it holding RTNL. The device leaves its namespace's list at the very
// start of that request, though, and the kernel announces it (RTM_DELLINK)
// before the waits.
//
// So DEL does not send the request itself: it hands the (already disarmed)
// host side to the node's reaper (reaper.go), subscribes to link events in
// the pod namespace, and returns as soon as the pod side is announced gone.
// The waits happen in the reaper after DEL has answered the runtime. If no
// reaper runs, DEL starts one, detached: its own binary, which deletes that
// pair and then serves later DELs until idle, so that a burst of deletions
// starts one process. If the reaper fails or stays silent, DEL deletes the
// pair itself.

// reaping is a reaper under way and what DEL needs to wait for it.
type reaping struct {
	updates  chan netlink.LinkUpdate
	done     chan struct{}
	answered chan error
	pod      *podNS
	podIdx   int
	host     netlink.Link
}

// startReap starts deleting the veth pair whose host side is host, so that
// the pod side leaves the namespace at nsPath. It returns nil when there is
// nothing to wait for: no host side, or a pod namespace (or pod side) that is
// already gone (the kernel destroys the pair with the namespace).
func startReap(nsPath string, host netlink.Link) (*reaping, error) {
	if host == nil || nsPath == "" {
		return nil, nil
	}
	pod, err := openPodNS(nsPath)
	if errors.Is(err, errNetNSGone) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("removing the pod side of %s: %w", host.Attrs().Name, err)
	}
	r := &reaping{
		updates:  make(chan netlink.LinkUpdate, 16),
		done:     make(chan struct{}),
		answered: make(chan error, 1),
		pod:      pod,
		podIdx:   host.Attrs().ParentIndex,
		host:     host,
	}
	// The reaper first: its start is the longest step, and it overlaps
	// with the rest of DEL. Whatever it deletes before the subscription
	// below exists, the look-up after it sees gone.
	r.spawn()
	ns := pod.fd
	if err := netlink.LinkSubscribeWithOptions(r.updates, r.done, netlink.LinkSubscribeOptions{Namespace: &ns}); err != nil {
		r.close()
		return nil, fmt.Errorf("watching links in %s: %w", nsPath, err)
	}
	if gone, err := r.podSideGone(); gone || err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

// spawn hands the host side to the node's reaper, starting one if none is
// running. When the reaper has answered (or cannot be reached or started),
// r.answered fires and wait deletes the pair itself if it is still there.
func (r *reaping) spawn() {
	name := r.host.Attrs().Name
	if conn, err := net.Dial("unix", reaperSocket); err == nil {
		go func() { r.answered <- askReaper(conn, name) }()
		return
	}
	self, err := os.Executable()
	if err != nil {
		r.answered <- err
		return
	}
	cmd := exec.Command(self, ReapArg, name)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // not in the runtime's process group
	if err := cmd.Start(); err != nil {
		r.answered <- err
		return
	}
	// The new reaper deletes this pair, then serves until idle; it exits
	// long after DEL, which does not wait for it.
	if err := cmd.Process.Release(); err != nil {
		r.answered <- err
	}
}

// wait returns once the pod side has left the pod namespace. If the reaper
// answered, failed or stayed silent for reapTimeout while the pod side is
// still there, DEL deletes the pair itself.
func (r *reaping) wait() error {
	if r == nil {
		return nil
	}
	defer r.close()
	timeout := time.NewTimer(reapTimeout)
	defer timeout.Stop()
	for {
		select {
		case u := <-r.updates:
			if u.Header.Type == unix.RTM_DELLINK && int(u.Index) == r.podIdx {
				return nil
			}
			continue
		case <-r.answered:
		case <-timeout.C:
		}
		if gone, err := r.podSideGone(); gone || err != nil {
			return err
		}
		if err := netlink.LinkDel(r.host); err != nil && !isNotFound(err) {
			return fmt.Errorf("deleting %s: %w", r.host.Attrs().Name, err)
		}
		return nil
	}
}

// podSideGone reports whether the host side's peer is no longer a veth in
// the pod namespace.
func (r *reaping) podSideGone() (bool, error) {
	link, err := r.pod.handle.LinkByIndex(r.podIdx)
	if err != nil {
		if isNotFound(err) {
			return true, nil
		}
		return false, fmt.Errorf("looking up the pod side of %s: %w", r.host.Attrs().Name, err)
	}
	return link.Type() != "veth", nil
}

func (r *reaping) close() {
	close(r.done)
	r.pod.Close()
}

// clearRemnant makes way for ADD's pod interface. An existing CNI_IFNAME is
// an error unless it is the pod side of a disarmed weft pair (left by a DEL
// that died before the pair was gone, or by a weft version whose DEL left
// the pair to the kernel), which is then deleted.
func clearRemnant(pod *podNS, nsPath, ifName string) error {
	link, err := pod.handle.LinkByName(ifName)
	if err != nil {
		if isNotFound(err) {
			return nil
		}
		return fmt.Errorf("looking up %s in the pod: %w", ifName, err)
	}
	host := disarmedPeer(link)
	if host == nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables,
			fmt.Sprintf("CNI_IFNAME: interface %q already exists in %s", ifName, nsPath), "")
	}
	if err := netlink.LinkDel(host); err != nil && !isNotFound(err) {
		return fmt.Errorf("deleting the disarmed pair %s/%s: %w", host.Attrs().Name, ifName, err)
	}
	return nil
}

// disarmedPeer returns the host side of podLink if podLink is the pod side
// of a disarmed weft veth pair, nil otherwise.
func disarmedPeer(podLink netlink.Link) netlink.Link {
	if podLink.Type() != "veth" {
		return nil
	}
	host, err := netlink.LinkByIndex(podLink.Attrs().ParentIndex)
	if err != nil {
		return nil
	}
	a := host.Attrs()
	if host.Type() != "veth" || !isHostVethName(a.Name) || a.Flags&net.FlagUp != 0 || a.ParentIndex != podLink.Attrs().Index {
		return nil
	}
	return host
}
