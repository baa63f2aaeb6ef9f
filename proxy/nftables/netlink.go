package nftables

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"
)

// Element writes bypass nft. nft spends its time in user space, not in the
// kernel: at 10k Services × 10 endpoints a one-element change costs nft
// about 20 ms of CPU (process start, cache of the table's objects,
// parsing), and the first load of about 200k elements about 5 s of CPU
// (9 s with one command per element, as knftables writes them), of which
// the kernel's commit is 0.5 s. So the elements of the table's plain sets
// and data maps go to the kernel as one nfnetlink batch (one transaction,
// like an nft -f), their keys and values as the renderer packed them;
// everything else (the table, chains, rules, set declarations, the interval
// set of sourceRanges) still goes through knftables. See Applier for how a
// sync orders the two.

// elemVerb is what an element operation does.
type elemVerb uint8

const (
	elemAdd    elemVerb = iota
	elemDelete          // the element with that key
	elemFlush           // every element of the set
	// elemFill flushes the set, then adds every element of the ruleset's
	// for it: the batch expands it as it is built, so that a full sync of
	// a large table does not hold an operation per element (2.4M at 100k
	// Services) besides the batch.
	elemFill
)

// elemOp is one element operation of a sync.
type elemOp struct {
	verb  elemVerb
	set   *Set
	key   packed
	value packedValue
	fill  *Ruleset // elemFill
}

// elements is how many elements ops write or delete.
func elements(ops []elemOp) int {
	n := 0
	for _, op := range ops {
		if op.verb == elemFill {
			n += op.fill.len(op.set)
		} else {
			n++
		}
	}
	return n
}

// nfnetlink's framing (linux/netfilter/nfnetlink.h, nf_tables.h).
const (
	nlmsgHdrLen = 16
	nfgenHdrLen = 4
	nlaHdrLen   = 4
	// An attribute's length is 16 bits: a message carries at most this many
	// bytes of elements, and a batch as many messages as it needs.
	maxElementBytes = 60 << 10
	nfnlMsgBatchEnd = unix.NFNL_MSG_BATCH_BEGIN + 1
)

// batch builds one nfnetlink batch of element messages for a table.
type batch struct {
	table string
	buf   []byte
	seq   uint32
	sets  []string // by seq - 1: the set each message writes, for errors
	// the open message: its set and verb, where it starts, where its
	// element list attribute starts (-1: none yet)
	cur      *Set
	verb     elemVerb
	msgAt    int
	elemsAt  int
	elements int
}

func newBatch(table string) *batch {
	b := &batch{table: table, elemsAt: -1, msgAt: -1}
	b.header(unix.NFNL_MSG_BATCH_BEGIN, unix.NLM_F_REQUEST, unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES)
	return b
}

// header starts a message; the nfgenmsg's res_id is in network order.
func (b *batch) header(typ uint16, flags uint16, family uint8, resID uint16) {
	b.seq++
	b.buf = binary.NativeEndian.AppendUint32(b.buf, 0) // length, set by end
	b.buf = binary.NativeEndian.AppendUint16(b.buf, typ)
	b.buf = binary.NativeEndian.AppendUint16(b.buf, flags)
	b.buf = binary.NativeEndian.AppendUint32(b.buf, b.seq)
	b.buf = binary.NativeEndian.AppendUint32(b.buf, 0)
	b.buf = append(b.buf, family, 0)
	b.buf = binary.BigEndian.AppendUint16(b.buf, resID)
}

// endMessage writes the length of the message that starts at at.
func (b *batch) endMessage(at int) {
	binary.NativeEndian.PutUint32(b.buf[at:], uint32(len(b.buf)-at))
}

// attr appends an attribute with a payload, padded to 4 bytes.
func (b *batch) attr(typ uint16, payload []byte) {
	b.buf = binary.NativeEndian.AppendUint16(b.buf, uint16(nlaHdrLen+len(payload)))
	b.buf = binary.NativeEndian.AppendUint16(b.buf, typ)
	b.buf = append(b.buf, payload...)
	for len(b.buf)%4 != 0 {
		b.buf = append(b.buf, 0)
	}
}

// nest opens a nested attribute; close it with endNest.
func (b *batch) nest(typ uint16) int {
	at := len(b.buf)
	b.buf = binary.NativeEndian.AppendUint16(b.buf, 0)
	b.buf = binary.NativeEndian.AppendUint16(b.buf, typ|unix.NLA_F_NESTED)
	return at
}

func (b *batch) endNest(at int) {
	binary.NativeEndian.PutUint16(b.buf[at:], uint16(len(b.buf)-at))
}

func cstring(s string) []byte { return append([]byte(s), 0) }

// closeMessage ends the open element message, if any.
func (b *batch) closeMessage() {
	if b.msgAt < 0 {
		return
	}
	if b.elemsAt >= 0 {
		b.endNest(b.elemsAt)
	}
	b.endMessage(b.msgAt)
	b.cur, b.msgAt, b.elemsAt, b.elements = nil, -1, -1, 0
}

// open starts a message of verb on set (a flush has no element list).
func (b *batch) open(verb elemVerb, set *Set) {
	b.closeMessage()
	typ, flags := uint16(unix.NFT_MSG_NEWSETELEM), uint16(unix.NLM_F_REQUEST|unix.NLM_F_CREATE)
	if verb != elemAdd {
		typ, flags = unix.NFT_MSG_DELSETELEM, unix.NLM_F_REQUEST
	}
	b.msgAt = len(b.buf)
	b.header(unix.NFNL_SUBSYS_NFTABLES<<8|typ, flags, unix.NFPROTO_INET, 0)
	b.sets = append(b.sets, set.Name)
	b.attr(unix.NFTA_SET_ELEM_LIST_TABLE, cstring(b.table))
	b.attr(unix.NFTA_SET_ELEM_LIST_SET, cstring(set.Name))
	b.cur, b.verb = set, verb
	if verb != elemFlush {
		b.elemsAt = b.nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
	}
}

// add appends one operation, in a new message when the open one is of
// another set or verb, or full.
func (b *batch) add(op elemOp) {
	if op.verb == elemFill {
		b.add(elemOp{verb: elemFlush, set: op.set})
		op.fill.each(op.set, func(k packed, v packedValue) {
			b.add(elemOp{verb: elemAdd, set: op.set, key: k, value: v})
		})
		return
	}
	if b.cur != op.set || b.verb != op.verb || op.verb == elemFlush || len(b.buf)-b.msgAt > maxElementBytes {
		b.open(op.verb, op.set)
	}
	if op.verb == elemFlush {
		return
	}
	el := b.nest(unix.NFTA_LIST_ELEM)
	k := b.nest(unix.NFTA_SET_ELEM_KEY)
	b.attr(unix.NFTA_DATA_VALUE, op.key.bytes())
	b.endNest(k)
	if op.verb == elemAdd && op.set.Value != "" {
		d := b.nest(unix.NFTA_SET_ELEM_DATA)
		b.attr(unix.NFTA_DATA_VALUE, op.value.bytes())
		b.endNest(d)
	}
	b.endNest(el)
	b.elements++
}

// finish closes the batch; the last element message asks for an
// acknowledgement, the proof that the batch was committed.
func (b *batch) finish() (ackSeq uint32) {
	if b.msgAt >= 0 {
		flags := binary.NativeEndian.Uint16(b.buf[b.msgAt+6:])
		binary.NativeEndian.PutUint16(b.buf[b.msgAt+6:], flags|unix.NLM_F_ACK)
		ackSeq = b.seq
	}
	b.closeMessage()
	at := len(b.buf)
	b.header(nfnlMsgBatchEnd, unix.NLM_F_REQUEST, unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES)
	b.endMessage(at)
	binary.NativeEndian.PutUint32(b.buf[0:], nlmsgHdrLen+nfgenHdrLen)
	return ackSeq
}

// netlinkElements sends element operations to the kernel as one nfnetlink
// batch: one transaction, committed or refused whole.
type netlinkElements struct {
	table string
}

// write commits ops in one transaction.
func (w netlinkElements) write(ops []elemOp) error {
	if len(ops) == 0 {
		return nil
	}
	b := newBatch(w.table)
	b.buf = slices.Grow(b.buf, 64*elements(ops)) // about what an IPv4 map element takes
	for _, op := range ops {
		b.add(op)
	}
	ackSeq := b.finish()
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return fmt.Errorf("opening an nfnetlink socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("binding an nfnetlink socket: %w", err)
	}
	// An error echoes only the header of the message it answers, not the
	// elements: a refused batch of large messages still fits the receive
	// buffer.
	if err := unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1); err != nil {
		return fmt.Errorf("setting NETLINK_CAP_ACK on an nfnetlink socket: %w", err)
	}
	// The kernel takes the batch in one message: the send buffer must hold
	// it (forcing it needs CAP_NET_ADMIN, which writing nftables needs too).
	if len(b.buf) > 200<<10 {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, len(b.buf)); err != nil {
			return fmt.Errorf("sizing the nfnetlink send buffer to %d bytes: %w", len(b.buf), err)
		}
	}
	// The kernel processes the batch inside the send: once it returns,
	// every answer is queued on the socket.
	if err := unix.Sendto(fd, b.buf, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("sending %d element operations to table inet %s: %w", elements(ops), w.table, err)
	}
	return readAcks(fd, b, ackSeq)
}

// readAcks reads the kernel's answers to a batch: an error names the set
// of the message it answers; success is the acknowledgement of ackSeq with
// no error before it.
func readAcks(fd int, b *batch, ackSeq uint32) error {
	rbuf := make([]byte, 64<<10)
	var errs []error
	acked := false
	for {
		n, _, err := unix.Recvfrom(fd, rbuf, unix.MSG_DONTWAIT)
		if errors.Is(err, unix.EAGAIN) {
			break
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("reading the kernel's answer: %w", err))
			break
		}
		msgs := rbuf[:n]
		for len(msgs) >= nlmsgHdrLen {
			l := int(binary.NativeEndian.Uint32(msgs))
			typ := binary.NativeEndian.Uint16(msgs[4:])
			if l < nlmsgHdrLen || l > len(msgs) {
				break
			}
			if typ == unix.NLMSG_ERROR && l >= nlmsgHdrLen+4+nlmsgHdrLen {
				code := int32(binary.NativeEndian.Uint32(msgs[nlmsgHdrLen:]))
				seq := binary.NativeEndian.Uint32(msgs[nlmsgHdrLen+4+8:])
				switch {
				case code == 0 && seq == ackSeq:
					acked = true
				case code != 0:
					what := "the batch"
					if i := int(seq) - 2; i >= 0 && i < len(b.sets) {
						what = "set " + b.sets[i]
					}
					errs = append(errs, fmt.Errorf("%s: %w", what, unix.Errno(-code)))
				}
			}
			msgs = msgs[(l+3)&^3:]
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("table inet %s refused the element batch: %w", b.table, errors.Join(errs...))
	}
	if !acked {
		return fmt.Errorf("table inet %s: the kernel did not acknowledge the element batch", b.table)
	}
	return nil
}
