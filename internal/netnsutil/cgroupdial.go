package netnsutil

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"time"

	"golang.org/x/sys/unix"
)

// Programs on a cgroup's socket hooks (weft's eBPF service proxy) act on
// sockets by the cgroup of the process that creates them: a socket a test
// opens from its own process is not one a pod's process would open. So
// CgroupDialer has a helper process, started in the cgroup and the network
// namespace, create and connect the socket and pass it back; the caller
// then uses it as its own, and the kernel still sees the pod's socket.

// dialHelperEnv marks a process started as the dial helper.
const dialHelperEnv = "WEFT_NETNSUTIL_DIAL_HELPER"

type dialRequest struct {
	Network, Addr string
	Timeout       time.Duration
}

// ServeDialHelper serves one dial when the process was started as the
// helper (it then exits), and returns at once otherwise. Programs that use
// CgroupDialer call it first thing in main (RunTests does, for tests).
func ServeDialHelper() {
	if os.Getenv(dialHelperEnv) == "" {
		return
	}
	if err := serveDial(); err != nil {
		fmt.Fprintln(os.Stderr, "dial helper:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func serveDial() error {
	ctl := os.NewFile(3, "control")
	var req dialRequest
	if err := json.NewDecoder(ctl).Decode(&req); err != nil {
		return err
	}
	c, err := net.DialTimeout(req.Network, req.Addr, req.Timeout)
	if err != nil {
		_, werr := ctl.Write([]byte(err.Error()))
		return werr
	}
	f, err := c.(interface{ File() (*os.File, error) }).File()
	if err != nil {
		return err
	}
	return unix.Sendmsg(int(ctl.Fd()), []byte("ok"), unix.UnixRights(int(f.Fd())), nil, 0)
}

// CgroupDialer is Dialer for sockets that must belong to the cgroup at
// cgroup (a cgroup v2 directory): each dial runs a helper process of this
// program (os.Executable, which must call ServeDialHelper) inside the
// namespace at path and that cgroup. With cgroup empty it is Dialer.
func CgroupDialer(path, cgroup string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if cgroup == "" {
		return Dialer(path, nil)
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		timeout := 10 * time.Second
		if dl, ok := ctx.Deadline(); ok {
			timeout = time.Until(dl)
		}
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		ours, theirs := os.NewFile(uintptr(fds[0]), "dial"), os.NewFile(uintptr(fds[1]), "dial-helper")
		defer ours.Close()
		cg, err := os.Open(cgroup)
		if err != nil {
			theirs.Close()
			return nil, err
		}
		self, err := os.Executable()
		if err != nil {
			theirs.Close()
			cg.Close()
			return nil, err
		}
		cmd := exec.CommandContext(ctx, self)
		cmd.Env = append(os.Environ(), dialHelperEnv+"=1")
		cmd.ExtraFiles = []*os.File{theirs}
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &unix.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
		start := cmd.Start
		if path != "" {
			start = func() error { return Do(path, cmd.Start) }
		}
		err = start()
		theirs.Close()
		cg.Close()
		if err != nil {
			return nil, fmt.Errorf("starting the dial helper in %s: %w", cgroup, err)
		}
		defer cmd.Wait()
		if err := json.NewEncoder(ours).Encode(dialRequest{network, addr, timeout}); err != nil {
			return nil, err
		}
		buf, oob := make([]byte, 512), make([]byte, unix.CmsgSpace(4))
		n, oobn, _, _, err := unix.Recvmsg(int(ours.Fd()), buf, oob, 0)
		if err != nil {
			return nil, err
		}
		if oobn == 0 {
			if n == 0 {
				return nil, errors.New("the dial helper exited without an answer")
			}
			return nil, fmt.Errorf("dial %s %s: %s", network, addr, buf[:n])
		}
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil || len(msgs) != 1 {
			return nil, fmt.Errorf("the dial helper's answer: %v", err)
		}
		got, err := unix.ParseUnixRights(&msgs[0])
		if err != nil || len(got) != 1 {
			return nil, fmt.Errorf("the dial helper's answer: %v", err)
		}
		f := os.NewFile(uintptr(got[0]), addr)
		defer f.Close()
		return net.FileConn(f)
	}
}
