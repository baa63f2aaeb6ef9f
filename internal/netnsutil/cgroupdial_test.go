package netnsutil

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestCgroupDialer: the socket comes from a helper process in the cgroup
// and the namespace, connected; the caller talks over it; a refused dial
// is an error. The server asks the kernel which cgroup the peer's process
// is in (SO_PEERCRED's pid, then /proc).
func TestCgroupDialer(t *testing.T) {
	requireIsolated(t)
	mnt := t.TempDir()
	if err := unix.Mount("cgroup2", mnt, "cgroup2", 0, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	name := fmt.Sprintf("weft-netnsutil-test-%d", os.Getpid())
	cg := filepath.Join(mnt, name)
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	defer func() {
		for i := 0; i < 100 && unix.Rmdir(cg) == unix.EBUSY; i++ {
			time.Sleep(20 * time.Millisecond)
		}
	}()
	path, err := NewNamed("nsutil-dial")
	if err != nil {
		t.Fatal(err)
	}
	defer Delete("nsutil-dial")

	// A unix socket shows the peer process; TCP in the namespace shows
	// the namespace is right.
	sock := filepath.Join(t.TempDir(), "s")
	ul, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	peerCgroup := make(chan string, 1)
	go func() {
		c, err := ul.Accept()
		if err != nil {
			peerCgroup <- err.Error()
			return
		}
		defer c.Close()
		raw, _ := c.(*net.UnixConn).SyscallConn()
		var cred *unix.Ucred
		_ = raw.Control(func(fd uintptr) { cred, _ = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", cred.Pid))
		peerCgroup <- string(b)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dial := CgroupDialer(path, cg)
	c, err := dial(ctx, "unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if got := <-peerCgroup; !strings.Contains(got, "0::/"+name+"\n") {
		t.Fatalf("the socket's creator was in %q, want the cgroup /%s", got, name)
	}

	var tl net.Listener
	if err := Do(path, func() (err error) { tl, err = net.Listen("tcp", "127.0.0.1:0"); return err }); err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	go func() {
		c, err := tl.Accept()
		if err == nil {
			fmt.Fprintln(c, "hello")
			c.Close()
		}
	}()
	c, err = dial(ctx, "tcp", tl.Addr().String())
	if err != nil {
		t.Fatalf("dialing a listener inside the namespace: %v", err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	c.Close()
	if err != nil || line != "hello\n" {
		t.Fatalf("read %q, %v over the passed socket", line, err)
	}
	tl.Close()
	if _, err := dial(ctx, "tcp", tl.Addr().String()); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("dialing a closed port: %v, want connection refused", err)
	}
}
