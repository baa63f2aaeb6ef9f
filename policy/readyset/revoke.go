package readyset

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// Revoker takes addresses out of the ready sets, both backends', over one
// netfilter netlink socket with one reused receive buffer. The CNI plugin
// opens it before it takes the IPAM lock and revokes under the lock, where
// every page fault and socket set-up would delay each pod starting behind
// it: under the lock, a revocation is two or three exchanges with the
// kernel and nothing else.
type Revoker struct {
	fd  int // -1: the kernel has no nfnetlink, so no ready set to revoke from
	seq uint32
	buf []byte
}

// Netlink constants of ipset (linux/netfilter/ipset/ip_set.h).
const (
	nfnlSubsysIPSet     = 6
	ipsetCmdDel         = 10
	ipsetProtocol       = 6
	ipsetAttrProtocol   = 1
	ipsetAttrSetName    = 2
	ipsetAttrData       = 7
	ipsetAttrIP         = 1
	ipsetAttrLineno     = 9
	ipsetAttrIPAddrIPv4 = 1
	ipsetAttrIPAddrIPv6 = 2
	// ipsetErrPrivate is where ipset's own error codes start.
	ipsetErrPrivate = 4096
)

// OpenRevoker opens the netfilter netlink socket revocations go through.
func OpenRevoker() (*Revoker, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		if errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.EAFNOSUPPORT) {
			return &Revoker{fd: -1}, nil // no nfnetlink: no policy sets here
		}
		return nil, fmt.Errorf("nfnetlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("nfnetlink bind: %w", err)
	}
	return &Revoker{fd: fd, buf: make([]byte, 8192)}, nil
}

// Close closes the socket.
func (r *Revoker) Close() {
	if r.fd >= 0 {
		_ = unix.Close(r.fd)
		r.fd = -1
	}
}

// Revoke removes addrs from their ready sets, as the package's Revoke
// describes: the ipset deletions in one exchange (the kernel carries them
// out one by one, an absent set failing only its own), then one nftables
// batch per address (a batch is one transaction: one absent element must
// not keep another from being deleted).
func (r *Revoker) Revoke(addrs []netip.Addr) error {
	if len(addrs) == 0 || r.fd < 0 {
		return nil
	}
	var batch []byte
	first := r.seq + 1
	for _, a := range addrs {
		r.seq++
		batch = append(batch, ipsetDelMsg(r.seq, SetName(a), a)...)
	}
	errs, err := r.exchange(batch, first, len(addrs))
	if err != nil {
		return fmt.Errorf("removing %s from their ipsets: %w", addrs, err)
	}
	for i, err := range errs {
		if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.EPROTONOSUPPORT) {
			return fmt.Errorf("removing %s from ipset %s: %w", addrs[i], SetName(addrs[i]), err)
		}
	}
	// A deletion is a transaction of nftables, costly even when it finds
	// nothing: first ask, in one exchange, which addresses the sets hold
	// (none, most often, or no table: the node runs the other backend).
	// The agent adds to the sets only under the IPAM lock, which the
	// caller holds, so what the answer says stays true.
	batch, first = nil, r.seq+1
	for _, a := range addrs {
		r.seq++
		batch = append(batch, nftElemMsg(nftMsgGetSetElem, unix.NLM_F_ACK, r.seq, NFTSetName(a), a.Unmap().AsSlice())...)
	}
	held, err := r.exchange(batch, first, len(addrs))
	if err != nil {
		return fmt.Errorf("looking up %s in the nftables ready sets: %w", addrs, err)
	}
	for i, a := range addrs {
		if errors.Is(held[i], unix.ENOENT) {
			continue // no table, no set, or not a member
		}
		r.seq++
		errs, err := r.exchange(nftDelMsg(r.seq, NFTSetName(a), a.Unmap().AsSlice()), r.seq, 1)
		if err == nil {
			err = errs[0]
		}
		if err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("removing %s from nftables set inet %s %s: %w", a, NFTTable, NFTSetName(a), err)
		}
	}
	return nil
}

// exchange sends msgs, whose n acknowledged requests have the sequence
// numbers first to first+n-1, and returns each one's outcome.
func (r *Revoker) exchange(msgs []byte, first uint32, n int) ([]error, error) {
	if err := unix.Sendto(r.fd, msgs, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, err
	}
	errs := make([]error, n)
	for acked := 0; acked < n; {
		got, _, err := unix.Recvfrom(r.fd, r.buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		replies, err := syscall.ParseNetlinkMessage(r.buf[:got])
		if err != nil {
			return nil, err
		}
		for _, m := range replies {
			i := int(m.Header.Seq - first)
			if m.Header.Type != unix.NLMSG_ERROR || m.Header.Seq < first || i >= n || len(m.Data) < 4 {
				continue
			}
			if code := -int32(binary.NativeEndian.Uint32(m.Data[:4])); code >= ipsetErrPrivate {
				errs[i] = fmt.Errorf("ipset error %d", code)
			} else if code != 0 {
				errs[i] = unix.Errno(code)
			}
			acked++
		}
	}
	return errs, nil
}

// ipsetDelMsg deletes a from the ipset set; an absent address is no error
// (no NLM_F_EXCL: ipset's -exist).
func ipsetDelMsg(seq uint32, set string, a netip.Addr) []byte {
	typ := uint16(ipsetAttrIPAddrIPv6)
	if a.Is4() || a.Is4In6() {
		typ = ipsetAttrIPAddrIPv4
	}
	ip := nlattr(unix.NLA_F_NET_BYTEORDER|typ, a.Unmap().AsSlice())
	data := append(nlattr(unix.NLA_F_NESTED|ipsetAttrIP, ip), nlattr(unix.NLA_F_NET_BYTEORDER|ipsetAttrLineno, make([]byte, 4))...)
	body := append(nlattr(ipsetAttrProtocol, []byte{ipsetProtocol}), nlattr(ipsetAttrSetName, cstring(set))...)
	body = append(body, nlattr(unix.NLA_F_NESTED|ipsetAttrData, data)...)
	return nlmsg(nfnlSubsysIPSet<<8|ipsetCmdDel, unix.NLM_F_REQUEST|unix.NLM_F_ACK, seq, unix.AF_NETLINK, 0, body)
}

// nftDelMsg is one batch deleting key from the nftables set.
func nftDelMsg(seq uint32, set string, key []byte) []byte {
	var msg []byte
	msg = append(msg, nlmsg(nfnlMsgBatchBegin, unix.NLM_F_REQUEST, seq, unix.AF_UNSPEC, nfnlSubsysNFTables, nil)...)
	msg = append(msg, nftElemMsg(nftMsgDelSetElem, unix.NLM_F_ACK, seq, set, key)...)
	return append(msg, nlmsg(nfnlMsgBatchEnd, unix.NLM_F_REQUEST, seq, unix.AF_UNSPEC, nfnlSubsysNFTables, nil)...)
}

// nftElemMsg is an nftables request of type typ about element key of the
// ready set.
func nftElemMsg(typ uint16, flags uint16, seq uint32, set string, key []byte) []byte {
	data := nlattr(nftaDataValue, key)
	elem := nlattr(unix.NLA_F_NESTED|nftaListElem, nlattr(unix.NLA_F_NESTED|nftaSetElemKey, data))
	body := append(nlattr(nftaSetElemListTable, cstring(NFTTable)), nlattr(nftaSetElemListSet, cstring(set))...)
	body = append(body, nlattr(unix.NLA_F_NESTED|nftaSetElemListElements, elem)...)
	return nlmsg(nfnlSubsysNFTables<<8|typ, unix.NLM_F_REQUEST|flags, seq, nfprotoInet, 0, body)
}
