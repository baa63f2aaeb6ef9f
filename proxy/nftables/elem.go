package nftables

import (
	"encoding/binary"
	"fmt"
	"iter"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/proxy/model"
)

// Elements are kept packed: the key and the value of each are the bytes
// the kernel takes (netlink.go sends them as they are), in fixed-size
// arrays without pointers. At 10k Services × 2 ports the renderer holds
// 220k elements; as strings they took about 500 bytes each, and every
// garbage collection marked them; packed, about 150, and the maps of them
// are not scanned. They become strings only for knftables (the test fake,
// the interval set, a table recreated through nft).

// field is how one part of a set's key or value is laid out in the
// kernel's registers (each part takes a multiple of 4 bytes).
type field uint8

const (
	fieldAddr   field = iota // an IPv4 or IPv6 address, network order
	fieldProto               // meta l4proto: one byte
	fieldPort                // th dport: two bytes, network order
	fieldInt                 // numgen's or jhash's result: 32 bits, host order
	fieldPrefix              // an address and its prefix length (one byte); only the interval set nft writes
)

// packed is an element's key in the kernel's layout; packedValue a map
// element's value (n 0: none).
type packed struct {
	n uint8
	b [44]byte // the longest key: an IPv6 frontend and source prefix
}

type packedValue struct {
	n uint8
	b [20]byte // an IPv6 address and a port
}

func (p packed) bytes() []byte      { return p.b[:p.n] }
func (v packedValue) bytes() []byte { return v.b[:v.n] }

// toPacked and toValue pack the parts in b; the sets' layouts (sets in
// ruleset.go) fit.
func toPacked(b []byte) packed {
	var p packed
	if len(b) > len(p.b) {
		panic(fmt.Sprintf("nftables: a key of %d bytes", len(b)))
	}
	p.n = uint8(copy(p.b[:], b))
	return p
}

func toValue(b []byte) packedValue {
	var v packedValue
	if len(b) > len(v.b) {
		panic(fmt.Sprintf("nftables: a value of %d bytes", len(b)))
	}
	v.n = uint8(copy(v.b[:], b))
	return v
}

// The parts, appended in the kernel's layout.

func appendAddr(b []byte, a netip.Addr) []byte {
	if a.Is4() {
		x := a.As4()
		return append(b, x[:]...)
	}
	x := a.As16()
	return append(b, x[:]...)
}

func appendProto(b []byte, p model.Protocol) []byte {
	return append(b, protoNumbers[proto(p)], 0, 0, 0)
}

func appendPort(b []byte, port uint16) []byte {
	return append(binary.BigEndian.AppendUint16(b, port), 0, 0)
}

func appendInt(b []byte, n uint32) []byte { return binary.NativeEndian.AppendUint32(b, n) }

func appendPrefix(b []byte, p netip.Prefix) []byte {
	return append(appendAddr(b, p.Addr()), byte(p.Bits()), 0, 0, 0)
}

var protoNumbers = map[string]byte{"tcp": unix.IPPROTO_TCP, "udp": unix.IPPROTO_UDP, "sctp": unix.IPPROTO_SCTP}

var protoNames = map[byte]string{unix.IPPROTO_TCP: "tcp", unix.IPPROTO_UDP: "udp", unix.IPPROTO_SCTP: "sctp"}

// encode appends the parts of one key or value given as nft prints them,
// laid out as fields say.
func encode(b []byte, fields []field, parts []string) ([]byte, error) {
	if len(parts) != len(fields) {
		return nil, fmt.Errorf("%d parts for %d fields", len(parts), len(fields))
	}
	for i, f := range fields {
		p := parts[i]
		switch f {
		case fieldAddr:
			a, err := netip.ParseAddr(p)
			if err != nil {
				return nil, err
			}
			b = appendAddr(b, a)
		case fieldProto:
			n, ok := protoNumbers[p]
			if !ok {
				v, err := strconv.ParseUint(p, 10, 8)
				if err != nil {
					return nil, fmt.Errorf("protocol %q", p)
				}
				n = byte(v)
			}
			b = append(b, n, 0, 0, 0)
		case fieldPort:
			v, err := strconv.ParseUint(p, 10, 16)
			if err != nil {
				return nil, fmt.Errorf("port %q", p)
			}
			b = appendPort(b, uint16(v))
		case fieldInt:
			v, err := strconv.ParseUint(p, 10, 32)
			if err != nil {
				return nil, fmt.Errorf("integer %q", p)
			}
			b = appendInt(b, uint32(v))
		case fieldPrefix:
			pr, err := netip.ParsePrefix(p)
			if err != nil {
				return nil, err
			}
			b = appendPrefix(b, pr)
		}
	}
	return b, nil
}

// decode returns the parts of a key or value of a set of family fam as
// nft prints them.
func decode(fields []field, fam int, b []byte) []string {
	alen := 4
	if fam == 6 {
		alen = 16
	}
	addr := func() netip.Addr {
		a, _ := netip.AddrFromSlice(b[:alen])
		b = b[alen:]
		return a
	}
	out := make([]string, 0, len(fields))
	for _, f := range fields {
		switch f {
		case fieldAddr:
			out = append(out, addr().String())
		case fieldProto:
			name, ok := protoNames[b[0]]
			if !ok {
				name = strconv.Itoa(int(b[0]))
			}
			out = append(out, name)
			b = b[4:]
		case fieldPort:
			out = append(out, strconv.Itoa(int(binary.BigEndian.Uint16(b))))
			b = b[4:]
		case fieldInt:
			out = append(out, strconv.FormatUint(uint64(binary.NativeEndian.Uint32(b)), 10))
			b = b[4:]
		case fieldPrefix:
			a := addr()
			out = append(out, netip.PrefixFrom(a, int(b[0])).String())
			b = b[4:]
		}
	}
	return out
}

// keyParts and valueParts are an element's key and value as nft prints
// them.
func (s *Set) keyParts(k packed) []string { return decode(s.keyFields, s.family, k.bytes()) }

func (s *Set) valueParts(v packedValue) []string {
	if s.Value == "" {
		return nil
	}
	return decode(s.valueFields, s.family, v.bytes())
}

// keyString is an element's key as nft prints it.
func (s *Set) keyString(k packed) string { return strings.Join(s.keyParts(k), " . ") }

// elemList is a list of elements as a port's output keeps them, back to
// back in one buffer: for each, the index of its set in sets, the lengths
// of its key and value, then their bytes. An IPv4 load-balancing element
// takes 23 bytes there, where an elem takes 88: at 100k Services × 2 ports
// × 10 endpoints that is 55 MB held instead of 210.
type elemList struct {
	sets []string // a port's frontend uses a few sets
	buf  []byte
}

// grow makes room for n more elements of about an IPv4 list's size.
func (l *elemList) grow(n int) { l.buf = slices.Grow(l.buf, 24*n) }

func (l *elemList) add(e elem) {
	i := slices.Index(l.sets, e.set)
	if i < 0 {
		if l.sets == nil {
			l.sets = make([]string, 0, 4) // a list, the verdict set, affinity, the kind of frontend
		}
		i = len(l.sets)
		l.sets = append(l.sets, e.set)
	}
	l.buf = append(l.buf, uint8(i), e.key.n, e.value.n)
	l.buf = append(append(l.buf, e.key.bytes()...), e.value.bytes()...)
}

// all yields the elements in the order they were added.
func (l *elemList) all() iter.Seq[elem] {
	return func(yield func(elem) bool) {
		for b := l.buf; len(b) > 0; {
			k, v := 3+int(b[1]), 3+int(b[1])+int(b[2])
			e := elem{set: l.sets[b[0]]}
			e.key.n, e.value.n = b[1], b[2]
			copy(e.key.b[:], b[3:k])
			copy(e.value.b[:], b[k:v])
			b = b[v:]
			if !yield(e) {
				return
			}
		}
	}
}
