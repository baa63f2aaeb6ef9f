// Package netnsutil gives tests and benchmarks a private network world:
// Isolate re-executes the program inside a fresh network and mount namespace,
// so nothing it does can reach the host's own links, routes, iptables or
// /run/netns, and everything it made disappears with it, even after kill -9.
package netnsutil

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// isolatedEnv marks the re-executed child; its value names the parent's
// network namespace ("net:[inode]").
const isolatedEnv = "WEFT_ISOLATED_NETNS"

// RunDir is where named namespaces live (a private tmpfs once isolated).
const RunDir = "/run/netns"

// Isolated reports whether this process is the isolated child.
func Isolated() bool { return os.Getenv(isolatedEnv) != "" }

// ParentNetNS names the namespace the isolated child was started from.
func ParentNetNS() string { return os.Getenv(isolatedEnv) }

// Isolate makes sure the rest of the program runs in a private network and
// mount namespace. In the parent it re-executes the program there, waits, and
// returns the child's exit code with reexeced true; the caller exits with it.
// In the child it prepares the namespace (loopback up, private /run/netns)
// and returns reexeced false, so the caller goes on.
func Isolate() (code int, reexeced bool, err error) {
	if Isolated() {
		return 0, false, prepare()
	}
	if os.Geteuid() != 0 {
		return 0, false, errors.New("network namespaces need root")
	}
	self, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		return 0, false, err
	}
	cmd := exec.Command("/proc/self/exe", os.Args[1:]...)
	cmd.Env = append(os.Environ(), isolatedEnv+"="+self)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// With CLONE_NEWNS, Go makes every mount private in the child first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: unix.CLONE_NEWNET | unix.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode(), true, nil
		}
		return 1, true, fmt.Errorf("re-executing in a private network namespace: %w", err)
	}
	return 0, true, nil
}

func prepare() error {
	if err := os.MkdirAll(RunDir, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", RunDir, "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("mounting a private %s: %w", RunDir, err)
	}
	// sysfs shows the links of the namespace that mounted it: remount it so
	// /sys/class/net describes this namespace, not the host's.
	if err := unix.Mount("sysfs", "/sys", "sysfs", 0, ""); err != nil {
		return fmt.Errorf("mounting a private /sys: %w", err)
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	return netlink.LinkSetUp(lo)
}

// NewNamed creates a network namespace bind-mounted at RunDir/name, with its
// loopback up, and returns its path. The calling thread's namespace is kept.
func NewNamed(name string) (string, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return "", err
	}
	defer orig.Close()
	h, err := netns.NewNamed(name)
	if err != nil {
		restore(orig)
		return "", fmt.Errorf("creating netns %s: %w", name, err)
	}
	defer h.Close()
	lo, lerr := netlink.LinkByName("lo")
	if lerr == nil {
		lerr = netlink.LinkSetUp(lo)
	}
	restore(orig)
	if lerr != nil {
		_ = Delete(name)
		return "", fmt.Errorf("setting lo up in %s: %w", name, lerr)
	}
	return RunDir + "/" + name, nil
}

// Delete removes a namespace made by NewNamed; a missing one is no error.
func Delete(name string) error {
	err := netns.DeleteNamed(name)
	if err != nil && errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// Do runs fn with the calling goroutine's thread inside the namespace at path.
// Sockets fn creates stay in that namespace after Do returns.
func Do(path string, fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return err
	}
	defer orig.Close()
	target, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("opening %s: %w", path, err)
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		return fmt.Errorf("entering %s: %w", path, err)
	}
	defer restore(orig)
	return fn()
}

// restore returns the locked thread to its namespace. It cannot fail short of
// a kernel bug; if it does, the thread must not run other goroutines, so the
// program stops.
func restore(orig netns.NsHandle) {
	if err := netns.Set(orig); err != nil {
		panic(fmt.Sprintf("netnsutil: restoring the thread's network namespace: %v", err))
	}
}

// RunTests is the body of a TestMain for tests that touch the kernel: it
// runs m's tests in a private network and mount namespace (see Isolate) and
// returns the exit code. Without root the tests run unisolated, and those
// that need the kernel skip (they check Isolated).
func RunTests(m interface{ Run() int }) int {
	ServeDialHelper()
	code, reexeced, err := Isolate()
	switch {
	case reexeced:
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
		return code
	case err != nil && Isolated():
		fmt.Fprintln(os.Stderr, "preparing the private network namespace:", err)
		return 1
	case err != nil:
		fmt.Fprintln(os.Stderr, "kernel tests will skip:", err)
	}
	return m.Run()
}

// Dialer returns a DialContext whose sockets are created inside the
// namespace at path (the caller's own when path is empty), bound to local
// when it is not nil. The sockets stay in that namespace for their life.
func Dialer(path string, local net.Addr) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		dial := func() (err error) {
			d := net.Dialer{LocalAddr: local}
			c, err = d.DialContext(ctx, network, addr)
			return err
		}
		if path == "" {
			return c, dial()
		}
		return c, Do(path, dial)
	}
}

// BridgedVeth creates a veth pair for a test's topology: name, enslaved to
// bridge and up, in the calling thread's namespace; peer in the namespace
// at peerNS. Both ends get mtu.
func BridgedVeth(name, bridge, peerNS, peer string, mtu int) error {
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		return err
	}
	target, err := netns.GetFromPath(peerNS)
	if err != nil {
		return err
	}
	defer target.Close()
	attrs := netlink.NewLinkAttrs()
	attrs.Name, attrs.MTU, attrs.MasterIndex = name, mtu, br.Attrs().Index
	veth := netlink.NewVeth(attrs)
	veth.PeerName, veth.PeerMTU, veth.PeerNamespace = peer, uint32(mtu), netlink.NsFd(target)
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("veth %s/%s: %w", name, peer, err)
	}
	return netlink.LinkSetUp(veth)
}
