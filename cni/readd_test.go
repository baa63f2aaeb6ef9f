package cni_test

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/weftnet/weft/cni"
	"github.com/weftnet/weft/internal/cnitest"
)

// TestAddAfterDelSameNetns: once DEL has returned, the pod namespace holds
// no weft interface, and ADD for another container into that namespace and
// CNI_IFNAME succeeds and carries traffic, as with the reference bridge
// plugin. A pair left disarmed in the namespace (a DEL killed half-way, or
// an older weft) does not block that ADD either.
func TestAddAfterDelSameNetns(t *testing.T) {
	for _, version := range []string{"0.4.0", "1.0.0", "1.1.0"} {
		t.Run(version, func(t *testing.T) {
			e := newEnv(t)
			list := e.list(version, "readd", e.weft(subnet(podCIDR)))
			a := e.pod()
			e.add(list, a)
			e.del(list, a)
			if l := podLinks(t, a.NetNS); len(l) != 0 {
				t.Fatalf("pod namespace after DEL holds %v, want no interface", l)
			}

			b := cnitest.Attachment{ContainerID: a.ContainerID + "-b", NetNS: a.NetNS, IfName: a.IfName}
			ipB := e.add(list, b)
			serve(t, b.NetNS, "b", ":8080")
			mustExchange(t, "", net.JoinHostPort(ipB.String(), "8080"), "b saw "+podGW)

			// A disarmed pair left in the namespace: host side down, as
			// DEL leaves it before the pair is gone.
			disarm(t, cni.HostVethName(b.ContainerID, b.IfName))
			c := cnitest.Attachment{ContainerID: a.ContainerID + "-c", NetNS: a.NetNS, IfName: a.IfName}
			ipC := e.add(list, c)
			if l := podLinks(t, a.NetNS); len(l) != 1 {
				t.Fatalf("pod namespace after ADD over a disarmed pair holds %v, want one interface", l)
			}
			mustExchange(t, "", net.JoinHostPort(ipC.String(), "8080"), "b saw "+podGW)
			if v := e.hostVeths(); len(v) != 1 || v[0] != cni.HostVethName(c.ContainerID, c.IfName) {
				t.Fatalf("bridge ports %v, want only %s's", v, c.ContainerID)
			}
			e.del(list, b)
			e.del(list, c)
			if l := podLinks(t, a.NetNS); len(l) != 0 {
				t.Fatalf("pod namespace after the last DEL holds %v", l)
			}
			if k := e.allocations("readd"); len(k) != 0 {
				t.Fatalf("allocations left: %v", k)
			}
		})
	}
}

// disarm sets a host-side veth down.
func disarm(t *testing.T, name string) {
	t.Helper()
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetDown(l); err != nil {
		t.Fatal(err)
	}
}

// TestOneReaperPerNode: the first DEL leaves one reaper serving the node,
// and later DELs are served by that same process instead of starting one
// each.
func TestOneReaperPerNode(t *testing.T) {
	e := newEnv(t)
	list := e.list("1.1.0", "reaper", e.weft(subnet(podCIDR)))
	pods := []cnitest.Attachment{e.pod(), e.pod(), e.pod(), e.pod()}
	for _, p := range pods {
		e.add(list, p)
	}
	e.del(list, pods[0])
	first := reapers(t)
	if len(first) != 1 {
		t.Fatalf("reapers after the first DEL: %v, want one", first)
	}
	for _, p := range pods[1:] {
		e.del(list, p)
		if l := podLinks(t, p.NetNS); len(l) != 0 {
			t.Fatalf("pod namespace after DEL holds %v", l)
		}
	}
	if now := reapers(t); len(now) != 1 || now[0] != first[0] {
		t.Fatalf("reapers after more DELs: %v, want only %v", now, first)
	}
}

// reapers lists the pids of reaper processes in this network namespace.
func reapers(t *testing.T) []int {
	t.Helper()
	self, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, d := range dirs {
		cmdline, err := os.ReadFile(d + "/cmdline")
		if err != nil || !strings.Contains(string(cmdline), "\x00"+cni.ReapArg+"\x00") {
			continue
		}
		if ns, err := os.Readlink(d + "/ns/net"); err != nil || ns != self {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(d))
		if err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestStuckReaper: DEL does not depend on the reaper. With the node's
// reaper stopped (it accepts the request but never answers), DEL still
// takes the pod side out of the namespace, by deleting the pair itself
// once it has waited long enough.
func TestStuckReaper(t *testing.T) {
	e := newEnv(t)
	list := e.list("1.1.0", "stuck", e.weft(subnet(podCIDR)))
	a, b := e.pod(), e.pod()
	e.add(list, a)
	e.add(list, b)
	e.del(list, a) // leaves a reaper serving the node
	pids := reapers(t)
	if len(pids) != 1 {
		t.Fatalf("reapers after DEL: %v, want one", pids)
	}
	if err := syscall.Kill(pids[0], syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = syscall.Kill(pids[0], syscall.SIGCONT)
		}
	}()
	e.del(list, b)
	if l := podLinks(t, b.NetNS); len(l) != 0 {
		t.Fatalf("pod namespace after DEL with a stuck reaper holds %v", l)
	}
	if v := e.hostVeths(); len(v) != 0 {
		t.Fatalf("bridge ports after DEL with a stuck reaper: %v", v)
	}

	// The request DEL gave up on is still queued at the reaper. The same
	// attachment is added again (its host veth has the same name), then the
	// reaper resumes and serves that late request: it must leave the new
	// pair alone.
	ipB := e.add(list, b)
	serve(t, b.NetNS, "b", ":8080")
	if err := syscall.Kill(pids[0], syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed = true
	waitReaperIdle(t)
	if v := e.armedVeths(); len(v) != 1 || v[0] != cni.HostVethName(b.ContainerID, b.IfName) {
		t.Fatalf("bridge ports after the reaper served a late request: %v, want %s's", v, b.ContainerID)
	}
	mustExchange(t, "", net.JoinHostPort(ipB.String(), "8080"), "b saw "+podGW)
}

// waitReaperIdle waits until no connection to the node's reaper is open:
// every request it had accepted has been served.
func waitReaperIdle(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile("/proc/net/unix")
		if err != nil {
			t.Fatal(err)
		}
		// The listener is the only socket bound to the reaper's name
		// ("@weft-cni-reaper" appears once per accepted connection too).
		if strings.Count(string(b), "@weft-cni-reaper") <= 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the reaper still holds connections after 10 s:\n%s", b)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestDelTrustsRootReaperOnly: a process that is not root listening on the
// reaper's name first (abstract names have no permissions) is not asked to
// delete anything, so its "ok" cannot leave the pair in the pod namespace:
// DEL deletes the pair itself.
func TestDelTrustsRootReaperOnly(t *testing.T) {
	e := newEnv(t)
	list := e.list("1.1.0", "squat", e.weft(subnet(podCIDR)))
	a := e.pod()
	e.add(list, a)
	for _, pid := range reapers(t) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		waitGone(t, pid)
	}
	// The name is free once the killed reaper's socket is released, which
	// the kernel may finish a moment after the process is gone.
	var ln net.Listener
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		err = asUID(65534, func() (err error) {
			ln, err = net.Listen("unix", "@weft-cni-reaper")
			return err
		})
		if err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dialled := make(chan struct{}, 1)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			select {
			case dialled <- struct{}{}:
			default:
			}
			_, _ = conn.Write([]byte("ok\n"))
			_ = conn.Close()
		}
	}()
	e.del(list, a)
	select {
	case <-dialled:
	default:
		t.Fatal("DEL never dialled the reaper's name: the squatter listens on the wrong one")
	}
	if l := podLinks(t, a.NetNS); len(l) != 0 {
		t.Fatalf("pod namespace after DEL holds %v: the squatter's answer was believed", l)
	}
	if v := e.hostVeths(); len(v) != 0 {
		t.Fatalf("bridge ports after DEL: %v", v)
	}
}
