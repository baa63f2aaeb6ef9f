package cni

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The node's reaper (see reap.go) is the plugin binary run as
// `weft reap-veth`: it serves deletions asked by DELs on an abstract unix
// socket until it has been idle for reaperIdle, so that a burst of pod
// deletions starts one process, not one per DEL. Abstract socket names
// belong to the network namespace: every node (namespace) has its own
// reaper, and nothing is left on disk. Only root peers are served, and only
// weft host veths are deleted.
//
// A request is one line, answered by "ok" or the error:
//
//	<host veth name> <ifindex>   delete that pair (if the name still has that
//	                             index); answered once the kernel announced
//	                             the deletion, that is once both ends have
//	                             left their namespaces
//	<host veth name>             delete it only if it is disarmed (down), as
//	                             the DELs of weft versions before the index
//	                             form asked
const (
	reaperSocket = "@weft-cni-reaper"
	reaperIdle   = 30 * time.Second
	reaperIO     = 5 * time.Second
	// reaperReady is what a new reaper writes on its stdout once it serves.
	reaperReady = "ready"
	// reaperRcvBuf is the receive buffer of the reaper's link subscription:
	// a busy node's link events must not overflow it (an overflow makes
	// the reaper stop serving, see deletions).
	reaperRcvBuf = 1 << 20
)

// Reap serves as the node's reaper unless another one already does. A name
// (what older DELs passed) is first deleted if it is a disarmed weft veth.
// It is what `weft reap-veth [name]` runs.
func Reap(name string) error {
	var err error
	if name != "" {
		err = reapOne(name)
	}
	ln, lerr := net.Listen("unix", reaperSocket)
	if lerr != nil {
		return err // another reaper serves the node
	}
	d, werr := watchDeletions(func() { _ = ln.Close() })
	if werr != nil {
		_ = ln.Close()
		return errors.Join(err, werr)
	}
	defer d.stop()
	announceReady()
	serveReaper(ln.(*net.UnixListener), d)
	return err
}

// announceReady tells the DEL that started this reaper that it serves, by
// writing reaperReady on stdout, then points stdout at /dev/null so that
// the pipe closes.
func announceReady() {
	fmt.Fprintln(os.Stdout, reaperReady)
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return
	}
	_ = unix.Dup3(int(null.Fd()), int(os.Stdout.Fd()), 0)
	_ = null.Close()
}

// reapOne deletes the host-side veth called name if it is a disarmed weft
// veth; an armed one belongs to a newer ADD of the same attachment.
func reapOne(name string) error {
	if !isHostVethName(name) {
		return fmt.Errorf("reap: %q is not a weft host veth name", name)
	}
	return removeDisarmed(name)
}

// serveReaper answers deletion requests until none came for reaperIdle or
// the listener is closed.
func serveReaper(ln *net.UnixListener, d *deletions) {
	var busy sync.WaitGroup
	defer busy.Wait()
	defer ln.Close()
	for {
		if err := ln.SetDeadline(time.Now().Add(reaperIdle)); err != nil {
			return
		}
		conn, err := ln.AcceptUnix()
		if err != nil {
			return // idle, or the listener broke: DELs start another reaper
		}
		busy.Go(func() { serveReap(conn, d) })
	}
}

// serveReap reads one request, carries it out, and answers "ok" or the error.
func serveReap(conn *net.UnixConn, d *deletions) {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(reaperIO))
	if !rootPeer(conn) {
		fmt.Fprintln(conn, "reap: only root may ask")
		return
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return
	}
	name, index, indexed := strings.Cut(strings.TrimSpace(line), " ")
	if !indexed {
		answer(conn, reapOne(name))
		return
	}
	idx, err := strconv.Atoi(index)
	if err != nil || idx <= 0 {
		answer(conn, fmt.Errorf("reap: %q is not an interface index", index))
		return
	}
	// remove answers "ok" itself as soon as the pair has left the
	// namespaces, before the kernel has finished deleting it.
	if err := d.remove(name, idx, func() { answer(conn, nil) }); err != nil {
		answer(conn, err)
	}
}

// answer writes "ok" for a nil error, the error otherwise.
func answer(conn net.Conn, err error) {
	if err != nil {
		fmt.Fprintln(conn, err)
		return
	}
	fmt.Fprintln(conn, "ok")
}

// rootPeer tells whether the process at the other end of conn is root: the
// one that connected, for a server, or the one that listened, for a client.
func rootPeer(conn *net.UnixConn) bool {
	raw, err := conn.SyscallConn()
	if err != nil {
		return false
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil || cerr != nil {
		return false
	}
	return cred.Uid == 0
}

// deletions follows the kernel's RTM_DELLINK announcements in the reaper's
// namespace, so that a request is answered as soon as its pair has left the
// namespaces instead of after the kernel's slow part of the deletion. If the
// subscription breaks (e.g. its buffer overflowed and events were lost),
// broken is called and waiters fall back to the deletion's own end.
type deletions struct {
	mu      sync.Mutex
	waiters map[int]chan struct{}
	broken  bool
	done    chan struct{}
}

// watchDeletions subscribes to the link events of the reaper's namespace
// on a raw rtnetlink socket and reads only the header and index of each:
// every link created or changed on the node comes through it, and the
// general netlink library would decode every attribute of every one.
func watchDeletions(broken func()) (*deletions, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("reap: watching link deletions: %w", err)
	}
	// FORCE needs CAP_NET_ADMIN, which the reaper has; otherwise the
	// ordinary limit applies.
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, reaperRcvBuf) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, reaperRcvBuf)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: unix.RTMGRP_LINK}); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("reap: watching link deletions: %w", err)
	}
	// Through the runtime's poller, so that stop (closing it) ends the
	// reading goroutine.
	sub := os.NewFile(uintptr(fd), "rtnetlink link events")
	raw, err := sub.SyscallConn()
	if err != nil {
		_ = sub.Close()
		return nil, fmt.Errorf("reap: watching link deletions: %w", err)
	}
	d := &deletions{waiters: map[int]chan struct{}{}, done: make(chan struct{})}
	go func() {
		<-d.done
		_ = sub.Close()
	}()
	go func() {
		buf := make([]byte, 64<<10)
		for {
			var n int
			var rerr error
			err := raw.Read(func(fd uintptr) bool {
				n, _, rerr = unix.Recvfrom(int(fd), buf, 0)
				return !errors.Is(rerr, unix.EAGAIN)
			})
			if err == nil {
				err = rerr
			}
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil {
				break // closed, or events lost (ENOBUFS)
			}
			msgs, err := syscall.ParseNetlinkMessage(buf[:n])
			if err != nil {
				break
			}
			for _, m := range msgs {
				if m.Header.Type == unix.RTM_DELLINK && len(m.Data) >= unix.SizeofIfInfomsg {
					d.announce(int(int32(binary.NativeEndian.Uint32(m.Data[4:]))))
				}
			}
		}
		d.mu.Lock()
		d.broken = true
		d.mu.Unlock()
		broken()
	}()
	return d, nil
}

func (d *deletions) stop() { close(d.done) }

// watch returns a channel closed when the link with index idx is announced
// deleted (never, if the subscription has broken).
func (d *deletions) watch(idx int) chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	ch := make(chan struct{})
	if !d.broken {
		d.waiters[idx] = ch
	}
	return ch
}

func (d *deletions) unwatch(idx int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.waiters, idx)
}

func (d *deletions) announce(idx int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if ch, ok := d.waiters[idx]; ok {
		close(ch)
		delete(d.waiters, idx)
	}
}

// remove deletes the weft veth pair whose host side is called name and has
// index idx. It calls gone once both ends have left their namespaces (at
// once if the link is already gone or is another one now), and returns
// once the kernel has finished the deletion, with its error if gone was not
// called.
func (d *deletions) remove(name string, idx int, gone func()) error {
	if !isHostVethName(name) {
		return fmt.Errorf("reap: %q is not a weft host veth name", name)
	}
	announced := d.watch(idx)
	defer d.unwatch(idx)
	h, err := openRTNL(-1)
	if err != nil {
		return fmt.Errorf("reap: %w", err)
	}
	defer h.close()
	link, found, err := h.getLink(getLinkByIndexMsg(idx))
	switch {
	case err != nil:
		return fmt.Errorf("reap: looking up %s: %w", name, err)
	case !found:
		gone()
		return nil
	}
	if link.name != name || link.kind != "veth" {
		gone() // the index is another link's now: that pair is gone
		return nil
	}
	deleted := make(chan error, 1)
	go func() {
		deleted <- h.run(nlreq{what: "deleting " + name, msg: delLinkByIndexMsg(idx)})
	}()
	select {
	case <-announced:
		gone()
		<-deleted
		return nil
	case err := <-deleted:
		if err != nil && !isNotFound(err) {
			return fmt.Errorf("reap: %w", err)
		}
		gone()
		return nil
	}
}
