package cni

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"
)

// ReapArg is the first argument with which the plugin binary runs as the
// node's reaper (reaper.go) instead of serving a CNI command:
// `weft reap-veth`.
const ReapArg = "reap-veth"

// reapTimeout bounds how long DEL waits for the reaper (to start, and to
// answer) before it deletes the pair itself.
const reapTimeout = 5 * time.Second

// Design note: taking the pod side out of the pod namespace.
//
// After DEL the pod namespace must not hold weft's interface any more: the
// runtime may run ADD for another container into the same namespace and
// CNI_IFNAME. Deleting a veth pair (or moving one end to another namespace)
// is a synchronous netlink request that returns only after the kernel has
// waited for RCU grace periods and for the last references to the devices:
// 20-30 ms on the reference machines, almost all of it spent waiting, little
// of it holding RTNL. Both ends leave their namespaces' lists at the very
// start of that request, though, and the kernel announces the deletion
// (RTM_DELLINK, in each end's namespace) right after, before the waits.
//
// So DEL does not send the request itself: it asks the node's reaper
// (reaper.go) to delete the pair, naming the host side and its interface
// index, and returns once the reaper has heard the kernel announce the host
// side's deletion in the node's namespace, which means the pod side has left
// the pod namespace too. The waits happen in the reaper after DEL has
// answered the runtime. The reaper is resident: its link subscription is
// open before it serves, so DEL itself opens neither the pod namespace nor
// a subscription. If no reaper runs, DEL starts one, detached: its own
// binary, which serves until idle, so that a burst of deletions starts one
// process. If the reaper cannot be started, fails or stays silent, DEL
// deletes the pair itself. The index makes a late request harmless: a
// reaper that was stopped and resumes after DEL gave up finds the name on
// another index (a newer ADD of the attachment) or on none, and deletes
// nothing.

// reaping is a deletion asked of the reaper and not answered yet.
type reaping struct {
	name  string // the host side's
	index int
	conn  net.Conn // nil when the reaper could not be asked
}

// startReap asks the node's reaper, starting one if none runs, to delete
// the veth pair whose host side is called name and has that index (0: there
// is none, and nothing to delete: it returns nil).
func startReap(name string, index int) *reaping {
	if index == 0 {
		return nil
	}
	r := &reaping{name: name, index: index}
	conn, err := dialReaper()
	if err != nil {
		return r // wait deletes the pair itself
	}
	_ = conn.SetDeadline(time.Now().Add(reapTimeout))
	if _, err := fmt.Fprintf(conn, "%s %d\n", name, index); err != nil {
		_ = conn.Close()
		return r
	}
	r.conn = conn
	return r
}

// wait returns once the pod side has left the pod namespace: when the
// reaper says so, or, if it failed or stayed silent for reapTimeout, after
// deleting the pair itself.
func (r *reaping) wait() error {
	if r == nil {
		return nil
	}
	if r.conn != nil {
		answer, err := bufio.NewReader(r.conn).ReadString('\n')
		_ = r.conn.Close()
		if err == nil && strings.TrimSpace(answer) == "ok" {
			return nil
		}
	}
	// By index: a newer ADD of the attachment has the name on another one.
	h, err := openRTNL(-1)
	if err != nil {
		return fmt.Errorf("deleting %s: %w", r.name, err)
	}
	defer h.close()
	err = h.run(nlreq{what: "deleting " + r.name, msg: delLinkByIndexMsg(r.index)})
	if err != nil && !isNotFound(err) {
		return err
	}
	return nil
}

// linkIndex returns the index of the node's link called name, 0 if there
// is none.
func linkIndex(name string) (int, error) {
	h, err := openRTNL(-1)
	if err != nil {
		return 0, err
	}
	defer h.close()
	link, found, err := h.getLink(getLinkMsg(name))
	switch {
	case err != nil:
		return 0, fmt.Errorf("looking up %s: %w", name, err)
	case !found:
		return 0, nil
	}
	return link.index, nil
}

// dialReaper connects to the node's reaper, starting one if none answers.
// Only a reaper whose socket root created is used: an abstract name has no
// permissions, so any process in the node's namespace could listen on it
// first and answer "ok" without deleting anything.
func dialReaper() (net.Conn, error) {
	if conn, err := dialRootReaper(); err == nil {
		return conn, nil
	}
	if err := spawnReaper(); err != nil {
		return nil, err
	}
	// The new reaper, or another DEL's that won the socket, serves now.
	return dialRootReaper()
}

func dialRootReaper() (*net.UnixConn, error) {
	conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: reaperSocket, Net: "unix"})
	if err != nil {
		return nil, err
	}
	if !rootPeer(conn) {
		_ = conn.Close()
		return nil, fmt.Errorf("the process listening on %s is not root", reaperSocket)
	}
	return conn, nil
}

// spawnReaper starts `weft reap-veth`, detached, and returns once it
// serves (it writes reaperReady on its stdout) or has exited (another
// reaper serves, or it failed).
func spawnReaper() error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("starting the reaper: %w", err)
	}
	rd, wr, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("starting the reaper: %w", err)
	}
	defer rd.Close()
	cmd := exec.Command(self, ReapArg)
	cmd.Stdout = wr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // not in the runtime's process group
	err = cmd.Start()
	_ = wr.Close()
	if err != nil {
		return fmt.Errorf("starting the reaper: %w", err)
	}
	// It serves until idle, long after DEL, which does not wait for it;
	// collecting its exit keeps a resident command server (server.go),
	// which outlives it, free of zombies.
	go func() { _ = cmd.Wait() }()
	_ = rd.SetReadDeadline(time.Now().Add(reapTimeout))
	_, err = bufio.NewReader(rd).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("starting the reaper: %w", err)
	}
	return nil
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
