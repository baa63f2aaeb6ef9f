package main

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/netnsutil"
)

// The sink: a backend drops the generator's packets at the ingress of its
// own interface, before its IP stack (a tcx program that drops IPv4 and
// passes the rest, so ARP keeps the node's neighbour entries alive). The
// interface's rx_packets counts a packet when the node's veth hands it
// over, before that hook, so it counts what the node forwarded; nothing
// answers, so no reply flows back through the node, and no ICMP error
// either. The same program at the head of the node's uplink makes the
// baseline run: packets the node drops at once.

// dropProgram returns the program: IPv4 -> TCX_DROP, else TCX_NEXT.
func dropProgram() (*ebpf.Program, error) {
	const (
		skbProtocol = 16 // offsetof(struct __sk_buff, protocol)
		tcxNext     = -1
		tcxDrop     = 2
	)
	return ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:    "pktbench_drop",
		Type:    ebpf.SchedCLS,
		License: "GPL",
		Instructions: asm.Instructions{
			asm.LoadMem(asm.R2, asm.R1, skbProtocol, asm.Word),
			// skb->protocol is in network order: ETH_P_IP reads 0x0008
			// on a little-endian machine.
			asm.JNE.Imm(asm.R2, int32(htons(unix.ETH_P_IP)), "pass"),
			asm.Mov.Imm(asm.R0, tcxDrop),
			asm.Return(),
			asm.Mov.Imm(asm.R0, tcxNext).WithSymbol("pass"),
			asm.Return(),
		},
	})
}

// attachDrop attaches prog at the head of dev's tcx ingress in the
// namespace at ns.
func attachDrop(ns, dev string, prog *ebpf.Program) (link.Link, error) {
	var l link.Link
	err := netnsutil.Do(ns, func() error {
		ifi, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		l, err = link.AttachTCX(link.TCXOptions{Interface: ifi.Index, Program: prog, Attach: ebpf.AttachTCXIngress, Anchor: link.Head()})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("attaching the drop program to %s: %w", dev, err)
	}
	return l, nil
}

// rxPackets reads dev's rx_packets (and rx_dropped) in the namespace at ns.
func rxPackets(ns, dev string) (rx, dropped uint64, err error) {
	err = netnsutil.Do(ns, func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		st := l.Attrs().Statistics
		if st == nil {
			return fmt.Errorf("%s: no statistics", dev)
		}
		rx, dropped = st.RxPackets, st.RxDropped
		return nil
	})
	return rx, dropped, err
}

// txDropped reads dev's tx_dropped in the namespace at ns (on veth: the
// packets its peer's backlog refused).
func txDropped(ns, dev string) (uint64, error) {
	var n uint64
	err := netnsutil.Do(ns, func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		if st := l.Attrs().Statistics; st != nil {
			n = st.TxDropped
		}
		return nil
	})
	return n, err
}

// capture is a packet socket on a backend's interface for the sample
// check: it sees frames before the drop program (taps run first).
type capture struct{ fd int }

func openCapture(ns, dev string) (*capture, error) {
	c := &capture{fd: -1}
	err := netnsutil.Do(ns, func() error {
		ifi, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		c.fd = fd
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 1<<20)
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index})
	})
	if err != nil {
		c.close()
		return nil, fmt.Errorf("capture on %s: %w", dev, err)
	}
	return c, nil
}

// sample is what a capture held: the generator's packets (ours), other
// IPv4 packets and non-IPv4 frames, and the addresses of the generator's
// packets as the backend saw them.
type sample struct {
	ours, otherIPv4, nonIP int
	srcs                   map[string]int
	dst                    map[string]int
	others                 []string // the first other IPv4 packets
}

// read drains the socket's queue.
func (c *capture) read(nonce uint64) (sample, error) {
	s := sample{srcs: map[string]int{}, dst: map[string]int{}}
	buf := make([]byte, 65536)
	for {
		n, from, err := unix.Recvfrom(c.fd, buf, 0)
		if errors.Is(err, unix.EAGAIN) {
			return s, nil
		}
		if err != nil {
			return s, err
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		p, ok := parseIPv4(buf[:n], nonce)
		switch {
		case !ok:
			s.nonIP++
		case p.ours:
			s.ours++
			s.srcs[p.src.String()]++
			s.dst[fmt.Sprintf("%s:%d", p.dst, p.dport)]++
		default:
			s.otherIPv4++
			if len(s.others) < 3 {
				s.others = append(s.others, fmt.Sprintf("%s:%d > %s:%d proto %d, %d bytes", p.src, p.sport, p.dst, p.dport, p.proto, n))
			}
		}
	}
}

func (c *capture) close() {
	if c != nil && c.fd >= 0 {
		_ = unix.Close(c.fd)
		c.fd = -1
	}
}

// settle waits a little for packets in flight (backlogs) to land.
func settle() { time.Sleep(50 * time.Millisecond) }
