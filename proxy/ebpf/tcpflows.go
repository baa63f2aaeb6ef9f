package ebpf

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Flow is a TCP connection weft translated: its client's address and
// port, the frontend the client addressed and the backend it reached.
// Socket: the socket programs translated it, so the client's socket is
// connected to the backend itself (else the per-packet programs did, and
// the client sees the frontend).
type Flow struct {
	Client, Frontend, Backend netip.AddrPort
	Socket                    bool
}

// tcpFlowFinder finds the TCP sockets the socket programs connected to
// given backends (bpf/tcpflows.c), in every network namespace a thread
// of the node's cgroup is in.
type tcpFlowFinder struct {
	objs   tcpflowsObjects
	iter   *link.Iter
	cgroup string
}

// loadTCPFlowFinder loads the iterator, sharing the socket programs'
// weft_revnat map revnat. A kernel without TCP iterators (Linux < 5.9)
// gives an error wrapping ebpf.ErrNotSupported.
func loadTCPFlowFinder(cgroup string, revnat *ebpf.Map) (*tcpFlowFinder, error) {
	f := &tcpFlowFinder{cgroup: cgroup}
	spec, err := loadTcpflows()
	if err == nil {
		err = spec.LoadAndAssign(&f.objs, sharingRevnat(spec, revnat))
	}
	if err != nil {
		return nil, fmt.Errorf("loading the TCP socket iterator: %w", err)
	}
	it, err := link.AttachIter(link.IterOptions{Program: f.objs.WeftTcpFlows})
	if err != nil {
		_ = f.objs.Close()
		return nil, fmt.Errorf("attaching the TCP socket iterator: %w", err)
	}
	f.iter = it
	return f, nil
}

func (f *tcpFlowFinder) close() {
	_ = f.iter.Close()
	_ = f.objs.Close()
}

// tcpFlowSize is the size of bpf/tcpflows.c's struct tcp_flow: three
// 16-byte addresses, three ports and padding.
const tcpFlowSize = 56

// maxGone is the most backends one iterator run looks for (the size of
// weft_tcp_gone).
const maxGone = 1 << 16

// find returns the open connections weft's socket programs translated to
// one of backends, maxGone backends per iterator run.
func (f *tcpFlowFinder) find(backends []netip.AddrPort) ([]Flow, error) {
	var out []Flow
	for len(backends) > 0 {
		chunk := backends[:min(len(backends), maxGone)]
		backends = backends[len(chunk):]
		flows, err := f.findChunk(chunk)
		out = append(out, flows...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

func (f *tcpFlowFinder) findChunk(backends []netip.AddrPort) ([]Flow, error) {
	keys := make([]tcpflowsTcpGoneKey, len(backends))
	vals := make([]uint8, len(backends))
	for i, b := range backends {
		keys[i] = tcpflowsTcpGoneKey{Addr: toWords(b.Addr()), Port: htons(b.Port())}
	}
	if _, err := f.objs.WeftTcpGone.BatchUpdate(keys, vals, nil); err != nil {
		return nil, fmt.Errorf("writing %d removed TCP backends: %w", len(keys), err)
	}
	defer func() { _, _ = f.objs.WeftTcpGone.BatchDelete(keys, nil) }()
	var out []Flow
	err := readIter(f.iter, f.cgroup, func(b []byte) {
		for ; len(b) >= tcpFlowSize; b = b[tcpFlowSize:] {
			addr := func(off int) netip.Addr {
				var w [4]uint32
				for i := range w {
					w[i] = binary.NativeEndian.Uint32(b[off+4*i:])
				}
				return fromWords(w)
			}
			port := func(off int) uint16 { return binary.BigEndian.Uint16(b[off:]) }
			out = append(out, Flow{Client: netip.AddrPortFrom(addr(0), port(48)),
				Backend: netip.AddrPortFrom(addr(16), port(50)), Frontend: netip.AddrPortFrom(addr(32), port(52)), Socket: true})
		}
	})
	return out, err
}

// TCPFlows returns the TCP connections weft translated to one of
// backends: those its socket programs connected (open ones), and those
// its per-packet programs translated from outside (weft_ct, which holds
// no TCP state: open ones, and closed ones the LRU map has not evicted).
// The backend's lock is held only to take the map and the finder: a sync
// does not wait for the reading. It first waits for the grace period
// after the last sync (grace.go), so that a socket a program connected
// while reading the lists that sync replaced is found too.
func (b *Backend) TCPFlows(backends []netip.AddrPort) ([]Flow, error) {
	b.mu.Lock()
	if b.np == nil {
		b.mu.Unlock()
		return nil, nil
	}
	over := b.graceOver()
	ct, err := b.np.WeftCt.Clone()
	finder := b.tcp
	b.mu.Unlock()
	<-over
	if err != nil {
		return nil, fmt.Errorf("weft_ct: %w", err)
	}
	defer ct.Close()
	want := map[netip.AddrPort]bool{}
	for _, be := range backends {
		want[be] = true
	}
	var (
		k   nodeportTuple
		v   nodeportCtValue
		out []Flow
	)
	it := ct.Iterate()
	for it.Next(&k, &v) {
		be := netip.AddrPortFrom(fromWords(v.Baddr), ntohs(v.Bport))
		if k.Proto != unix.IPPROTO_TCP || !want[be] {
			continue
		}
		out = append(out, Flow{Client: netip.AddrPortFrom(fromWords(k.Saddr), ntohs(k.Sport)),
			Frontend: netip.AddrPortFrom(fromWords(k.Daddr), ntohs(k.Dport)), Backend: be})
	}
	if err := it.Err(); err != nil {
		return out, fmt.Errorf("reading weft_ct: %w", err)
	}
	if finder == nil {
		return out, nil
	}
	sock, err := finder.find(backends)
	return append(out, sock...), err
}

// ctKernel is bpf/nodeport.c's CT_KERNEL.
const ctKernel = 2

// adoptKernelFlows writes, for every open TCP connection the kernel's
// conntrack translates (its reply comes from another address or port than
// the client addressed: another proxy mode's DNAT, before this mode took
// the node over), an entry of weft_ct that leaves its packets to the
// stack, where that conntrack entry goes on translating them. Without it
// the per-packet program would balance such a connection's next packet
// to a backend of its own, which would answer with a reset.
func (b *Backend) adoptKernelFlows() error {
	var keys []nodeportTuple
	for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, fam)
		if err != nil {
			return fmt.Errorf("listing conntrack entries: %w", err)
		}
		for _, f := range flows {
			tcp, ok := f.ProtoInfo.(*netlink.ProtoInfoTCP)
			if f.Forward.Protocol != unix.IPPROTO_TCP || !ok || tcp.State < ctEstablished || tcp.State > ctLastAck {
				continue
			}
			if f.Forward.DstIP.Equal(f.Reverse.SrcIP) && f.Forward.DstPort == f.Reverse.SrcPort {
				continue // not translated
			}
			src, _ := netip.AddrFromSlice(f.Forward.SrcIP)
			dst, _ := netip.AddrFromSlice(f.Forward.DstIP)
			keys = append(keys, nodeportTuple{Saddr: toWords(src.Unmap()), Daddr: toWords(dst.Unmap()),
				Sport: htons(f.Forward.SrcPort), Dport: htons(f.Forward.DstPort), Proto: unix.IPPROTO_TCP})
		}
	}
	if len(keys) == 0 {
		return nil
	}
	vals := make([]nodeportCtValue, len(keys))
	for i := range vals {
		vals[i].Masq = ctKernel
	}
	if _, err := b.np.WeftCt.BatchUpdate(keys, vals, nil); err != nil {
		return fmt.Errorf("writing %d connections to weft_ct: %w", len(keys), err)
	}
	return nil
}

// Conntrack's TCP states of an open connection (established to last ACK).
const (
	ctEstablished = 3
	ctLastAck     = 6
)
