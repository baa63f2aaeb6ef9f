package cni

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The node's reaper (see reap.go) is the plugin binary run as
// `weft reap-veth <name>`: it deletes that pair, then serves deletions
// asked by later DELs on an abstract unix socket until it has been idle
// for reaperIdle, so that a burst of pod deletions starts one process, not
// one per DEL. Abstract socket names belong to the network namespace: every
// node (namespace) has its own reaper, and nothing is left on disk. Only
// root peers are served, and only disarmed weft veths are deleted.
const (
	reaperSocket = "@weft-cni-reaper"
	reaperIdle   = 30 * time.Second
	reaperIO     = 5 * time.Second
)

// Reap deletes the disarmed weft veth called name (and its pod side), then
// serves as the node's reaper unless another one already does. It is what
// `weft reap-veth` runs.
func Reap(name string) error {
	ln, lerr := net.Listen("unix", reaperSocket)
	err := reapOne(name)
	if lerr != nil {
		return err // another reaper serves the node
	}
	serveReaper(ln.(*net.UnixListener))
	return err
}

// reapOne deletes the host-side veth called name if it is a disarmed weft
// veth; an armed one belongs to a newer ADD of the same attachment.
func reapOne(name string) error {
	if !isHostVethName(name) {
		return fmt.Errorf("reap: %q is not a weft host veth name", name)
	}
	return removeDisarmed(name)
}

// serveReaper answers deletion requests until none came for reaperIdle.
func serveReaper(ln *net.UnixListener) {
	var busy sync.WaitGroup
	defer busy.Wait()
	defer ln.Close()
	for {
		if err := ln.SetDeadline(time.Now().Add(reaperIdle)); err != nil {
			return
		}
		conn, err := ln.AcceptUnix()
		if err != nil {
			return // idle, or the listener broke: DELs fall back to their own
		}
		busy.Go(func() { serveReap(conn) })
	}
}

// serveReap reads one veth name, deletes it, and answers "ok" or the error.
func serveReap(conn *net.UnixConn) {
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
	if err := reapOne(strings.TrimSpace(line)); err != nil {
		fmt.Fprintln(conn, err)
		return
	}
	fmt.Fprintln(conn, "ok")
}

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

// askReaper sends name to the reaper on conn and returns once it answered.
func askReaper(conn net.Conn, name string) error {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(reaperIO))
	if _, err := fmt.Fprintln(conn, name); err != nil {
		return fmt.Errorf("asking the reaper: %w", err)
	}
	answer, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return fmt.Errorf("asking the reaper: %w", err)
	}
	if answer = strings.TrimSpace(answer); answer != "ok" {
		return errors.New(answer)
	}
	return nil
}
