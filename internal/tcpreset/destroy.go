package tcpreset

import (
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// A client on the node itself cannot be sent a segment out of a device.
// Its socket is in the node's own network namespace, though, where the
// kernel can abort it: sock_diag's SOCK_DESTROY (CONFIG_INET_DIAG_DESTROY,
// CAP_NET_ADMIN) finds the socket by its 4-tuple, fails it with
// ECONNABORTED and sends its peer a reset, as tcp_abort does.

// sockDestroy is sock_diag's SOCK_DESTROY message type.
const sockDestroy = 21

// errNoSocket: no socket has the flow's 4-tuple (closed meanwhile).
var errNoSocket = errors.New("no such socket")

// abort destroys the socket of f's client, which is on this node.
func abort(f Flow) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return fmt.Errorf("opening a sock_diag socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Sendto(fd, destroyRequest(f), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("asking to destroy the socket: %w", err)
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return fmt.Errorf("reading the answer to destroying the socket: %w", err)
	}
	const hdr = unix.SizeofNlMsghdr
	if n < hdr+4 || binary.NativeEndian.Uint16(buf[4:]) != unix.NLMSG_ERROR {
		return fmt.Errorf("an unexpected answer to destroying the socket (%d bytes)", n)
	}
	switch errno := unix.Errno(-int32(binary.NativeEndian.Uint32(buf[hdr:]))); errno {
	case 0:
		return nil
	case unix.ENOENT:
		return errNoSocket
	case unix.EOPNOTSUPP:
		return fmt.Errorf("destroying a socket: %w (the kernel lacks CONFIG_INET_DIAG_DESTROY)", errno)
	default:
		return fmt.Errorf("destroying the socket: %w", errno)
	}
}

// destroyRequest is the netlink message asking to destroy f's client
// socket: a header, then struct inet_diag_req_v2 whose socket ID is the
// client's side (source the client, destination the server), any device,
// no cookie.
func destroyRequest(f Flow) []byte {
	const hdr, req = unix.SizeofNlMsghdr, 56
	b := make([]byte, hdr+req)
	binary.NativeEndian.PutUint32(b[0:], uint32(len(b)))
	binary.NativeEndian.PutUint16(b[4:], sockDestroy)
	binary.NativeEndian.PutUint16(b[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	r := b[hdr:]
	r[0] = unix.AF_INET
	if f.Client.Addr().Unmap().Is6() {
		r[0] = unix.AF_INET6
	}
	r[1] = unix.IPPROTO_TCP
	binary.NativeEndian.PutUint32(r[4:], 0xffffffff) // every state
	id := r[8:]
	binary.BigEndian.PutUint16(id[0:], f.Client.Port())
	binary.BigEndian.PutUint16(id[2:], f.Server.Port())
	copy(id[4:20], f.Client.Addr().Unmap().AsSlice())
	copy(id[20:36], f.Server.Addr().Unmap().AsSlice())
	// id[36:40] is the device, 0 for any; the cookie is INET_DIAG_NOCOOKIE.
	binary.NativeEndian.PutUint32(id[40:], 0xffffffff)
	binary.NativeEndian.PutUint32(id[44:], 0xffffffff)
	return b
}
