package cni

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// rtnl is a minimal rtnetlink client for ADD's and DEL's hot paths: one
// blocking socket per namespace, one receive buffer reused for every
// answer, and requests sent in batches that the kernel carries out in
// order. A general
// netlink library opens a socket per request, allocates a fresh 64 KiB
// buffer per answer and decodes every attribute of every link; in a
// process that lives for one command, each fresh page is a page fault, and
// those dominated ADD's own work. CHECK, GC, the bridge set-up and the
// reaper keep the general library: they are not per-pod hot paths.
type rtnl struct {
	fd  int
	seq uint32
	buf []byte
}

// Kernel constants x/sys/unix does not name: the link dump filter that
// leaves out statistics, and the veth attribute holding the peer.
const (
	rtextFilterSkipStats = 1 << 3
	vethInfoPeer         = 1
)

// rtnlBufSize holds any answer ADD and DEL ask for (a link, or
// acknowledgements). A dump (the bridge's addresses) comes in parts no
// larger than the buffer the reader offers.
const rtnlBufSize = 16 << 10

// openRTNL opens an rtnetlink socket in the calling thread's namespace, or,
// with ns >= 0, in the network namespace whose file descriptor ns is.
func openRTNL(ns int) (*rtnl, error) {
	if ns < 0 {
		return newRTNL()
	}
	// A socket belongs to the namespace of the thread that created it:
	// switch this thread there and back, with the goroutine pinned to it.
	runtime.LockOSThread()
	self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("opening this thread's network namespace: %w", err)
	}
	defer self.Close()
	if err := unix.Setns(ns, unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("entering the pod network namespace: %w", err)
	}
	r, err := newRTNL()
	if serr := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); serr != nil {
		// The thread is in the wrong namespace: keep it locked, so that
		// the runtime retires it with this goroutine.
		if r != nil {
			r.close()
		}
		return nil, fmt.Errorf("leaving the pod network namespace: %w", serr)
	}
	runtime.UnlockOSThread()
	return r, err
}

func newRTNL() (*rtnl, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("rtnetlink socket: %w", err)
	}
	// Errors name the offending attribute; dumps honour the filters in
	// their request (the one dump asks for one link's addresses; a kernel
	// without strict checking sends all, and the reader filters).
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_EXT_ACK, 1)
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_GET_STRICT_CHK, 1)
	return &rtnl{fd: fd, buf: make([]byte, rtnlBufSize)}, nil
}

func (r *rtnl) close() { _ = unix.Close(r.fd) }

// nlmsg is one request under construction.
type nlmsg struct {
	b     []byte
	nests []int
}

func newNlmsg(typ, flags uint16, hdr []byte) *nlmsg {
	m := &nlmsg{b: make([]byte, unix.NLMSG_HDRLEN, 256)}
	binary.NativeEndian.PutUint16(m.b[4:], typ)
	binary.NativeEndian.PutUint16(m.b[6:], flags|unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	m.b = append(m.b, hdr...)
	return m
}

func (m *nlmsg) attr(typ uint16, data []byte) *nlmsg {
	l := unix.SizeofRtAttr + len(data)
	m.b = binary.NativeEndian.AppendUint16(m.b, uint16(l))
	m.b = binary.NativeEndian.AppendUint16(m.b, typ)
	m.b = append(m.b, data...)
	m.pad()
	return m
}

func (m *nlmsg) pad() {
	for len(m.b)%4 != 0 {
		m.b = append(m.b, 0)
	}
}

func (m *nlmsg) str(typ uint16, s string) *nlmsg { return m.attr(typ, append([]byte(s), 0)) }

func (m *nlmsg) u32(typ uint16, v uint32) *nlmsg {
	return m.attr(typ, binary.NativeEndian.AppendUint32(nil, v))
}

// begin opens a nested attribute; end closes the innermost one.
func (m *nlmsg) begin(typ uint16) *nlmsg {
	m.nests = append(m.nests, len(m.b))
	return m.attr(typ, nil)
}

func (m *nlmsg) end() *nlmsg {
	start := m.nests[len(m.nests)-1]
	m.nests = m.nests[:len(m.nests)-1]
	binary.NativeEndian.PutUint16(m.b[start:], uint16(len(m.b)-start))
	return m
}

// ifinfomsg is a link message header.
func ifinfomsg(family uint8, index int32, flags, change uint32) []byte {
	b := make([]byte, unix.SizeofIfInfomsg)
	b[0] = family
	binary.NativeEndian.PutUint32(b[4:], uint32(index))
	binary.NativeEndian.PutUint32(b[8:], flags)
	binary.NativeEndian.PutUint32(b[12:], change)
	return b
}

// exchange sends msgs in one batch and returns each one's outcome. The
// kernel carries out the requests in order; one failing does not stop the
// next. reply, if not nil, receives the answer body of every request that
// has one (a looked-up link, each part of a dump), with the request's
// position. A dump, which ends with NLMSG_DONE instead of an
// acknowledgement, must be the batch's last request: a socket runs one
// dump at a time.
func (r *rtnl) exchange(reply func(i int, typ uint16, body []byte), msgs ...*nlmsg) ([]error, error) {
	first := r.seq + 1
	var batch []byte
	for _, m := range msgs {
		r.seq++
		binary.NativeEndian.PutUint32(m.b[0:], uint32(len(m.b)))
		binary.NativeEndian.PutUint32(m.b[8:], r.seq)
		batch = append(batch, m.b...)
	}
	if err := unix.Sendto(r.fd, batch, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("rtnetlink send: %w", err)
	}
	errs := make([]error, len(msgs))
	for acked := 0; acked < len(msgs); {
		n, _, err := unix.Recvfrom(r.fd, r.buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("rtnetlink receive: %w", err)
		}
		nms, err := syscall.ParseNetlinkMessage(r.buf[:n])
		if err != nil {
			return nil, fmt.Errorf("rtnetlink receive: %w", err)
		}
		for _, nm := range nms {
			i := int(nm.Header.Seq - first)
			if nm.Header.Seq < first || i >= len(msgs) {
				continue // an answer to an earlier batch
			}
			if nm.Header.Type != unix.NLMSG_ERROR && nm.Header.Type != unix.NLMSG_DONE {
				if reply != nil {
					reply(i, nm.Header.Type, nm.Data)
				}
				continue
			}
			if len(nm.Data) < 4 {
				if nm.Header.Type == unix.NLMSG_DONE {
					acked++ // an old kernel's empty NLMSG_DONE
					continue
				}
				return nil, errors.New("rtnetlink receive: short error message")
			}
			if code := int32(binary.NativeEndian.Uint32(nm.Data)); code != 0 {
				errs[i] = unix.Errno(-code)
			}
			acked++
		}
	}
	return errs, nil
}

// rtLink is what ADD, DEL and the reaper need to know of a link.
type rtLink struct {
	index int
	peer  int // IFLA_LINK: a veth's peer's index, in the peer's namespace
	mac   net.HardwareAddr
	name  string
	kind  string // IFLA_INFO_KIND: "veth", "bridge", ...
	flags uint32 // IFF_*
}

// getLink asks for one link (getLinkMsg or getLinkByIndexMsg) and returns
// it; found is false, with no error, when the kernel has no such link.
func (h *rtnl) getLink(msg *nlmsg) (link rtLink, found bool, err error) {
	var perr error
	errs, err := h.exchange(func(_ int, typ uint16, body []byte) {
		if typ == unix.RTM_NEWLINK {
			link, perr = parseLink(body)
		}
	}, msg)
	switch {
	case err != nil:
		return rtLink{}, false, err
	case isNotFound(errs[0]):
		return rtLink{}, false, nil
	case errs[0] != nil || perr != nil:
		return rtLink{}, false, errors.Join(errs[0], perr)
	}
	return link, true, nil
}

// getLinkMsg asks for the link called name.
func getLinkMsg(name string) *nlmsg {
	return newNlmsg(unix.RTM_GETLINK, 0, ifinfomsg(unix.AF_UNSPEC, 0, 0, 0)).
		str(unix.IFLA_IFNAME, name).
		u32(unix.IFLA_EXT_MASK, rtextFilterSkipStats)
}

// parseLink decodes the parts of an RTM_NEWLINK body that rtLink holds.
func parseLink(body []byte) (rtLink, error) {
	if len(body) < unix.SizeofIfInfomsg {
		return rtLink{}, errors.New("short link message")
	}
	l := rtLink{
		index: int(int32(binary.NativeEndian.Uint32(body[4:]))),
		flags: binary.NativeEndian.Uint32(body[8:]),
	}
	attrs, err := parseAttrs(body[unix.SizeofIfInfomsg:])
	if err != nil {
		return rtLink{}, err
	}
	for _, a := range attrs {
		switch a.typ {
		case unix.IFLA_LINK:
			if len(a.data) >= 4 {
				l.peer = int(int32(binary.NativeEndian.Uint32(a.data)))
			}
		case unix.IFLA_ADDRESS:
			l.mac = net.HardwareAddr(append([]byte(nil), a.data...))
		case unix.IFLA_IFNAME:
			l.name = cString(a.data)
		case unix.IFLA_LINKINFO:
			info, err := parseAttrs(a.data)
			if err != nil {
				return rtLink{}, err
			}
			for _, i := range info {
				if i.typ == unix.IFLA_INFO_KIND {
					l.kind = cString(i.data)
				}
			}
		}
	}
	return l, nil
}

// cString is a netlink string attribute without its terminating NUL.
func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// getAddrsMsg asks for the addresses of link index (a dump).
func getAddrsMsg(index int) *nlmsg {
	hdr := make([]byte, unix.SizeofIfAddrmsg)
	binary.NativeEndian.PutUint32(hdr[4:], uint32(index))
	m := newNlmsg(unix.RTM_GETADDR, unix.NLM_F_DUMP, hdr)
	// A dump is answered by its parts and NLMSG_DONE, not acknowledged.
	binary.NativeEndian.PutUint16(m.b[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	return m
}

// parseAddr decodes an RTM_NEWADDR body: the link's index and the address.
func parseAddr(body []byte) (int, netip.Addr, error) {
	if len(body) < unix.SizeofIfAddrmsg {
		return 0, netip.Addr{}, errors.New("short address message")
	}
	index := int(binary.NativeEndian.Uint32(body[4:]))
	attrs, err := parseAttrs(body[unix.SizeofIfAddrmsg:])
	if err != nil {
		return 0, netip.Addr{}, err
	}
	var addr netip.Addr
	for _, a := range attrs {
		// IFA_LOCAL is the address itself where the two differ
		// (point-to-point links); IFA_ADDRESS otherwise.
		if ip, ok := netip.AddrFromSlice(a.data); ok && (a.typ == unix.IFA_LOCAL || a.typ == unix.IFA_ADDRESS && !addr.IsValid()) {
			addr = ip
		}
	}
	return index, addr, nil
}

type rtattr struct {
	typ  uint16
	data []byte
}

func parseAttrs(b []byte) ([]rtattr, error) {
	var out []rtattr
	for len(b) >= unix.SizeofRtAttr {
		l := int(binary.NativeEndian.Uint16(b))
		if l < unix.SizeofRtAttr || l > len(b) {
			return nil, errors.New("malformed netlink attribute")
		}
		out = append(out, rtattr{typ: binary.NativeEndian.Uint16(b[2:]) &^ unix.NLA_F_NESTED, data: b[unix.SizeofRtAttr:l]})
		l = (l + unix.RTA_ALIGNTO - 1) &^ (unix.RTA_ALIGNTO - 1)
		if l > len(b) {
			break
		}
		b = b[l:]
	}
	return out, nil
}

// nlreq is one request of a batch: what it does (for errors), the
// message, and an outcome that is no failure (e.g. EEXIST for a route
// that is already there), 0 for none.
type nlreq struct {
	what   string
	msg    *nlmsg
	ignore unix.Errno
}

// run sends reqs in one batch and returns the first failure, named by its
// request.
func (r *rtnl) run(reqs ...nlreq) error {
	if len(reqs) == 0 {
		return nil
	}
	msgs := make([]*nlmsg, len(reqs))
	for i, q := range reqs {
		msgs[i] = q.msg
	}
	errs, err := r.exchange(nil, msgs...)
	if err != nil {
		return fmt.Errorf("%s: %w", reqs[0].what, err)
	}
	for i, err := range errs {
		if err != nil && (reqs[i].ignore == 0 || !errors.Is(err, reqs[i].ignore)) {
			return fmt.Errorf("%s: %w", reqs[i].what, err)
		}
	}
	return nil
}

// vethMsg creates a veth pair: the host side called host, up, on bridge
// master, its peer called peer with the given MAC, down, in the namespace
// whose descriptor is nsFd.
func vethMsg(host, peer string, mtu, master, nsFd int, peerMAC net.HardwareAddr) *nlmsg {
	m := newNlmsg(unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL, ifinfomsg(unix.AF_UNSPEC, 0, unix.IFF_UP, unix.IFF_UP)).
		str(unix.IFLA_IFNAME, host).
		u32(unix.IFLA_MTU, uint32(mtu)).
		u32(unix.IFLA_MASTER, uint32(master)).
		begin(unix.IFLA_LINKINFO).
		attr(unix.IFLA_INFO_KIND, []byte("veth")).
		begin(unix.IFLA_INFO_DATA).
		begin(vethInfoPeer)
	// The peer's attributes follow a link header of their own. The peer
	// cannot be created up: the kernel opens it before it is paired.
	m.b = append(m.b, ifinfomsg(unix.AF_UNSPEC, 0, 0, 0)...)
	return m.str(unix.IFLA_IFNAME, peer).
		u32(unix.IFLA_MTU, uint32(mtu)).
		u32(unix.IFLA_NET_NS_FD, uint32(nsFd)).
		attr(unix.IFLA_ADDRESS, peerMAC).
		end().end().end()
}

// linkUpMsg sets link index up.
func linkUpMsg(index int) *nlmsg {
	return newNlmsg(unix.RTM_NEWLINK, 0, ifinfomsg(unix.AF_UNSPEC, int32(index), unix.IFF_UP, unix.IFF_UP))
}

// getLinkByIndexMsg asks for link index.
func getLinkByIndexMsg(index int) *nlmsg {
	return newNlmsg(unix.RTM_GETLINK, 0, ifinfomsg(unix.AF_UNSPEC, int32(index), 0, 0)).
		u32(unix.IFLA_EXT_MASK, rtextFilterSkipStats)
}

// delLinkByIndexMsg deletes link index.
func delLinkByIndexMsg(index int) *nlmsg {
	return newNlmsg(unix.RTM_DELLINK, 0, ifinfomsg(unix.AF_UNSPEC, int32(index), 0, 0))
}

// delLinkMsg deletes the link called name.
func delLinkMsg(name string) *nlmsg {
	return newNlmsg(unix.RTM_DELLINK, 0, ifinfomsg(unix.AF_UNSPEC, 0, 0, 0)).str(unix.IFLA_IFNAME, name)
}

// hairpinMsg lets the bridge port index send frames back out of itself.
func hairpinMsg(index int) *nlmsg {
	return newNlmsg(unix.RTM_SETLINK, 0, ifinfomsg(unix.AF_BRIDGE, int32(index), 0, 0)).
		begin(unix.IFLA_PROTINFO|unix.NLA_F_NESTED).
		attr(unix.IFLA_BRPORT_MODE, []byte{1}).
		end()
}

// addrMsg adds the address p (with its prefix length) to link index; an
// IPv4 address gets its subnet's broadcast address, an IPv6 one skips
// duplicate address detection (the allocator guarantees uniqueness, and
// DAD would hold the address back for about a second).
func addrMsg(index int, p netip.Prefix) *nlmsg {
	ip := p.Addr().AsSlice()
	hdr := make([]byte, unix.SizeofIfAddrmsg)
	hdr[0] = unix.AF_INET
	if p.Addr().Is6() {
		hdr[0] = unix.AF_INET6
		hdr[2] = unix.IFA_F_NODAD
	}
	hdr[1] = uint8(p.Bits())
	binary.NativeEndian.PutUint32(hdr[4:], uint32(index))
	m := newNlmsg(unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_EXCL, hdr).
		attr(unix.IFA_LOCAL, ip).
		attr(unix.IFA_ADDRESS, ip)
	if p.Addr().Is4() && p.Bits() < 31 {
		brd := binary.BigEndian.Uint32(ip) | (1<<(32-p.Bits()) - 1)
		m.attr(unix.IFA_BROADCAST, binary.BigEndian.AppendUint32(nil, brd))
	}
	return m
}

// routeMsg adds a route to dst via gw (none: on-link) out of link index,
// in the main table.
func routeMsg(index int, dst net.IPNet, gw net.IP) *nlmsg {
	hdr := make([]byte, unix.SizeofRtMsg)
	dstIP := dst.IP.To4()
	hdr[0] = unix.AF_INET
	if dstIP == nil {
		dstIP = dst.IP.To16()
		hdr[0] = unix.AF_INET6
	}
	ones, _ := dst.Mask.Size()
	hdr[1] = uint8(ones)
	hdr[4] = unix.RT_TABLE_MAIN
	hdr[5] = unix.RTPROT_BOOT
	hdr[6] = unix.RT_SCOPE_UNIVERSE
	hdr[7] = unix.RTN_UNICAST
	m := newNlmsg(unix.RTM_NEWROUTE, unix.NLM_F_CREATE|unix.NLM_F_EXCL, hdr).attr(unix.RTA_DST, dstIP)
	if gw != nil {
		g := gw.To4()
		if hdr[0] == unix.AF_INET6 || g == nil {
			g = gw.To16()
		}
		m.attr(unix.RTA_GATEWAY, g)
	}
	return m.u32(unix.RTA_OIF, uint32(index))
}

// neighMsg sets a REACHABLE neighbour entry for ip at mac on link index.
func neighMsg(index int, ip netip.Addr, mac net.HardwareAddr) *nlmsg {
	hdr := make([]byte, unix.SizeofNdMsg)
	hdr[0] = unix.AF_INET
	if ip.Is6() {
		hdr[0] = unix.AF_INET6
	}
	binary.NativeEndian.PutUint32(hdr[4:], uint32(index))
	binary.NativeEndian.PutUint16(hdr[8:], unix.NUD_REACHABLE)
	return newNlmsg(unix.RTM_NEWNEIGH, unix.NLM_F_CREATE|unix.NLM_F_REPLACE, hdr).
		attr(unix.NDA_DST, ip.AsSlice()).
		attr(unix.NDA_LLADDR, mac)
}

// randomMAC returns a random unicast, locally administered MAC address,
// as the kernel picks for a veth end.
func randomMAC() (net.HardwareAddr, error) {
	mac := make(net.HardwareAddr, 6)
	if _, err := unix.Getrandom(mac, 0); err != nil {
		return nil, fmt.Errorf("random MAC address: %w", err)
	}
	mac[0] = mac[0]&0xfe | 0x02
	return mac, nil
}
