package netpoltest

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/weftnet/weft/internal/netnsutil"
)

// SCTP on the kernel bed. Go's net has no SCTP, so the bed's SCTP servers
// and probes are raw sockets (one-to-one style: SOCK_STREAM, IPPROTO_SCTP)
// made inside the pods' namespaces. A kernel without the sctp module (this
// machine's) cannot make them: there the bed serves and probes TCP and UDP
// only, exactly as before, unless SCTPEnv says SCTP is required (the VM
// suite, whose kernel has it), which makes its absence a failure.

// SCTPEnv set to "required" makes a kernel without SCTP fail the bed
// instead of leaving SCTP out of it.
const SCTPEnv = "WEFT_SCTP_KERNEL"

var (
	sctpOnce sync.Once
	sctpErr  error // why the kernel cannot make SCTP sockets; nil when it can
)

// SCTPSupported reports whether the kernel makes SCTP sockets (the error
// says why not). It probes once per process.
func SCTPSupported() error {
	sctpOnce.Do(func() {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
		if err != nil {
			sctpErr = fmt.Errorf("the kernel makes no SCTP socket (no sctp module?): %w", err)
			return
		}
		unix.Close(fd)
	})
	return sctpErr
}

// enableSCTP adds SCTP to Protocols (so to the bed's container ports, the
// oracle grids the backends' kernel tests build from Protocols, and the
// random policies) when the kernel has SCTP. Beds are built one at a time
// (no parallel kernel tests), so the write races no reader. It changes nothing otherwise,
// but fails t when SCTPEnv requires SCTP. Only the kernel bed calls it:
// the lab's workloads serve no SCTP.
func enableSCTP(t testing.TB) {
	t.Helper()
	if err := SCTPSupported(); err != nil {
		if os.Getenv(SCTPEnv) == "required" {
			t.Fatalf("%s=required: %v", SCTPEnv, err)
		}
		return
	}
	if !slices.Contains(Protocols, corev1.ProtocolSCTP) {
		Protocols = append(slices.Clip(Protocols), corev1.ProtocolSCTP)
	}
}

// serveSCTP, inside a pod's namespace, accepts (and closes) SCTP
// associations on port over both families until t ends.
func serveSCTP(t testing.TB, port int32) error {
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
	if err != nil {
		return fmt.Errorf("sctp socket: %w", err)
	}
	f := os.NewFile(uintptr(fd), fmt.Sprintf("sctp-listener-%d", port))
	err = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0)
	if err == nil {
		err = unix.Bind(fd, &unix.SockaddrInet6{Port: int(port)})
	}
	if err == nil {
		err = unix.Listen(fd, 128)
	}
	if err != nil {
		f.Close()
		return fmt.Errorf("sctp listener on %d: %w", port, err)
	}
	t.Cleanup(func() { f.Close() })
	raw, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return err
	}
	go func() {
		for {
			// Read waits (in the runtime's poller) until the listener is
			// readable, that is an association is waiting, or it is
			// closed.
			err := raw.Read(func(lfd uintptr) bool {
				for {
					c, _, err := unix.Accept4(int(lfd), unix.SOCK_CLOEXEC)
					if err != nil {
						return !errors.Is(err, unix.EAGAIN)
					}
					unix.Close(c)
				}
			})
			if err != nil {
				return
			}
		}
	}()
	return nil
}

// probeSCTP reports whether an SCTP association from from's namespace to
// to on port is established before ctx ends: a non-blocking connect, a
// poll for writability (a one-to-one socket turns writable only once its
// association is established; an abort shows as an error), then SO_ERROR.
func probeSCTP(ctx context.Context, from, to Target, port int32) bool {
	ip, err := netip.ParseAddr(to.IP)
	if err != nil {
		return false
	}
	var sa unix.Sockaddr
	family := unix.AF_INET
	if ip.Is4() {
		sa = &unix.SockaddrInet4{Port: int(port), Addr: ip.As4()}
	} else {
		family = unix.AF_INET6
		sa = &unix.SockaddrInet6{Port: int(port), Addr: ip.As16()}
	}
	fd := -1
	err = netnsutil.Do(from.NSPath, func() error {
		s, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
		if err != nil {
			return err
		}
		fd = s
		if err := unix.Connect(s, sa); err != nil && !errors.Is(err, unix.EINPROGRESS) {
			return err
		}
		return nil
	})
	if fd >= 0 {
		defer unix.Close(fd)
	}
	if err != nil {
		return false
	}
	for {
		wait := time.Until(deadline(ctx))
		if wait <= 0 {
			return false
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		n, err := unix.Poll(fds, int(wait.Milliseconds())+1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n == 0 {
			return false
		}
		soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
		return err == nil && soErr == 0 && fds[0].Revents&(unix.POLLERR|unix.POLLHUP) == 0 && fds[0].Revents&unix.POLLOUT != 0
	}
}

func deadline(ctx context.Context) time.Time {
	if dl, ok := ctx.Deadline(); ok {
		return dl
	}
	return time.Now().Add(ProbeTimeout)
}
