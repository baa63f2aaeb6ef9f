package main

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/weftnet/weft/internal/netnsutil"
)

// connBed is a bridge with a server and a client pod namespace.
type connBed struct {
	server, client string // netns paths
	ln             net.Listener
}

func newConnBed() (*connBed, error) {
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		return nil, err
	}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "weft0"}}
	if err := netlink.LinkAdd(br); err != nil {
		return nil, err
	}
	gw, _ := netlink.ParseAddr("10.250.0.1/24")
	if err := netlink.AddrAdd(br, gw); err != nil {
		return nil, err
	}
	if err := netlink.LinkSetUp(br); err != nil {
		return nil, err
	}
	b := &connBed{}
	var err error
	if b.server, err = pod("server", br, serverIP); err != nil {
		return nil, err
	}
	if b.client, err = pod("client", br, clientIP); err != nil {
		return nil, err
	}
	err = netnsutil.Do(b.server, func() (err error) {
		b.ln, err = net.Listen("tcp", ":80")
		return err
	})
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := b.ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return b, nil
}

func pod(name string, br netlink.Link, ip netip.Addr) (string, error) {
	path, err := netnsutil.NewNamed("bench-" + name)
	if err != nil {
		return "", err
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "v-" + name, MasterIndex: br.Attrs().Index}, PeerName: "eth0"}
	if err := netlink.LinkAdd(veth); err != nil {
		return "", err
	}
	peer, err := netlink.LinkByName("eth0")
	if err != nil {
		return "", err
	}
	h, err := netns.GetFromPath(path)
	if err != nil {
		return "", err
	}
	defer h.Close()
	if err := netlink.LinkSetNsFd(peer, int(h)); err != nil {
		return "", err
	}
	host, _ := netlink.LinkByName("v-" + name)
	if err := netlink.LinkSetUp(host); err != nil {
		return "", err
	}
	return path, netnsutil.Do(path, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
}

// rate opens n TCP connections one after the other from the client to the
// server and returns connections per second.
func (b *connBed) rate(n int) (float64, error) {
	var elapsed time.Duration
	err := netnsutil.Do(b.client, func() error {
		d := net.Dialer{Timeout: 2 * time.Second}
		addr := net.JoinHostPort(serverIP.String(), "80")
		t0 := time.Now()
		for i := range n {
			c, err := d.Dial("tcp", addr)
			if err != nil {
				return fmt.Errorf("connection %d: %w", i, err)
			}
			_ = c.(*net.TCPConn).SetLinger(0) // reset: no TIME_WAIT to exhaust the ports
			c.Close()
		}
		elapsed = time.Since(t0)
		return nil
	})
	return float64(n) / elapsed.Seconds(), err
}

func (b *connBed) close() {
	b.ln.Close()
	_ = netnsutil.Delete("bench-server")
	_ = netnsutil.Delete("bench-client")
	if l, err := netlink.LinkByName("weft0"); err == nil {
		_ = netlink.LinkDel(l)
	}
}
