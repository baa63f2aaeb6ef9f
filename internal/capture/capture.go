// Package capture records the frames crossing one link, for tests that
// must show what did or did not cross a wire (an underlay carrying only
// tunnel packets).
package capture

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/netnsutil"
)

// Capture is a packet socket on one link, reading until Stop.
type Capture struct {
	mu     sync.Mutex
	frames [][]byte
	stop   atomic.Bool
	done   chan struct{}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// Start records every frame of the link named link in the namespace at
// nsPath, both directions.
func Start(nsPath, link string) (*Capture, error) {
	var fd int
	err := netnsutil.Do(nsPath, func() error {
		l, err := netlink.LinkByName(link)
		if err != nil {
			return err
		}
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: l.Attrs().Index}); err != nil {
			unix.Close(fd)
			return err
		}
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 100000}); err != nil {
			unix.Close(fd)
			return err
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	c := &Capture{done: make(chan struct{})}
	go func() {
		defer close(c.done)
		defer unix.Close(fd)
		buf := make([]byte, 65536)
		drained := 0
		for {
			// Once stopped, what the socket already holds is read too
			// (without waiting, and at most a receive buffer's worth on
			// a busy link), so that Stop returns every frame that crossed
			// before it.
			stopping, flags := c.stop.Load(), 0
			if stopping {
				flags = unix.MSG_DONTWAIT
				if drained++; drained > 4096 {
					return
				}
			}
			n, _, err := unix.Recvfrom(fd, buf, flags)
			if err != nil {
				if stopping {
					return
				}
				continue
			}
			c.mu.Lock()
			c.frames = append(c.frames, bytes.Clone(buf[:n]))
			c.mu.Unlock()
		}
	}()
	return c, nil
}

// Stop ends the capture and returns its frames; later calls return them
// again.
func (c *Capture) Stop() [][]byte {
	if c.stop.CompareAndSwap(false, true) {
		<-c.done
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.frames
}

// Packet is an IPv4 frame's addresses and transport ports (0 for a
// protocol without ports).
type Packet struct {
	Src, Dst         netip.Addr
	Proto            uint8
	SrcPort, DstPort uint16
}

// IPv4 reads frame as an Ethernet frame carrying IPv4; ok is false for
// anything else.
func IPv4(frame []byte) (p Packet, ok bool) {
	if len(frame) < 14+20 || binary.BigEndian.Uint16(frame[12:]) != unix.ETH_P_IP {
		return p, false
	}
	ip := frame[14:]
	hl := int(ip[0]&0x0f) * 4
	p = Packet{Src: netip.AddrFrom4([4]byte(ip[12:16])), Dst: netip.AddrFrom4([4]byte(ip[16:20])), Proto: ip[9]}
	if (p.Proto == unix.IPPROTO_UDP || p.Proto == unix.IPPROTO_TCP) && len(ip) >= hl+4 {
		p.SrcPort, p.DstPort = binary.BigEndian.Uint16(ip[hl:]), binary.BigEndian.Uint16(ip[hl+2:])
	}
	return p, true
}

// Contains reports whether any frame holds b.
func Contains(frames [][]byte, b []byte) bool {
	for _, f := range frames {
		if bytes.Contains(f, b) {
			return true
		}
	}
	return false
}
