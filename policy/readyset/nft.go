package readyset

import (
	"encoding/binary"
	"net/netip"

	"golang.org/x/sys/unix"
)

// The nftables policy backend (policy/nftables) keeps the ready sets as
// sets of its table inet weft-policy. The plugin takes an address out of
// them the same way as out of the ipsets: one netlink request, no process
// started (nft would cost the plugin a process start and a cache load on
// every ADD). A missing table or set, or an absent element, is no error:
// the node runs the other policy backend, or none.
const (
	NFTTable = "weft-policy"
	NFTSet4  = "ready4"
	NFTSet6  = "ready6"
)

// NFTSetName is the nftables ready set of a's family.
func NFTSetName(a netip.Addr) string {
	if a.Is4() || a.Is4In6() {
		return NFTSet4
	}
	return NFTSet6
}

// Netlink constants of nf_tables (linux/netfilter/nf_tables.h,
// nfnetlink.h).
const (
	nfnlSubsysNFTables = 10
	nfnlMsgBatchBegin  = unix.NLMSG_MIN_TYPE
	nfnlMsgBatchEnd    = unix.NLMSG_MIN_TYPE + 1
	nftMsgGetSetElem   = 13
	nftMsgDelSetElem   = 14
	nfprotoInet        = 1

	nftaSetElemListTable    = 1
	nftaSetElemListSet      = 2
	nftaSetElemListElements = 3
	nftaListElem            = 1
	nftaSetElemKey          = 1
	nftaDataValue           = 1
)

// nlmsg is a netlink message with an nfgenmsg header (family, version 0,
// res_id big-endian) and body.
func nlmsg(typ, flags uint16, seq uint32, family uint8, resID uint16, body []byte) []byte {
	n := unix.NLMSG_HDRLEN + 4 + len(body)
	b := make([]byte, unix.NLMSG_HDRLEN+4, align(n))
	binary.NativeEndian.PutUint32(b[0:], uint32(n))
	binary.NativeEndian.PutUint16(b[4:], typ)
	binary.NativeEndian.PutUint16(b[6:], flags)
	binary.NativeEndian.PutUint32(b[8:], seq)
	b[16] = family
	binary.BigEndian.PutUint16(b[18:], resID)
	b = append(b, body...)
	return b[:align(n)]
}

// nlattr is one netlink attribute, padded to 4 bytes.
func nlattr(typ uint16, payload []byte) []byte {
	n := unix.SizeofNlAttr + len(payload)
	b := make([]byte, align(n))
	binary.NativeEndian.PutUint16(b[0:], uint16(n))
	binary.NativeEndian.PutUint16(b[2:], typ)
	copy(b[unix.SizeofNlAttr:], payload)
	return b
}

func cstring(s string) []byte { return append([]byte(s), 0) }

func align(n int) int { return (n + 3) &^ 3 }
