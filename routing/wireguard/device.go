package wireguard

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/conn"
	wgdevice "golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Implementation is where the WireGuard device runs.
type Implementation string

const (
	// Auto takes the kernel's when it has the link type, else userspace.
	Auto Implementation = "auto"
	// Kernel is the kernel module's device, configured over generic netlink.
	Kernel Implementation = "kernel"
	// Userspace is wireguard-go in the agent's process over a TUN device.
	// The TUN device is persistent: while the agent restarts it stays,
	// with its routes, and packets to it wait or drop; none leave in clear.
	Userspace Implementation = "userspace"
)

// ParseImplementation reads an implementation's name ("" is Auto).
func ParseImplementation(s string) (Implementation, error) {
	switch impl := Implementation(s); impl {
	case "":
		return Auto, nil
	case Auto, Kernel, Userspace:
		return impl, nil
	}
	return "", fmt.Errorf("wireguard implementation %q: want auto, kernel or userspace", s)
}

// device is one running WireGuard device, whichever implementation.
type device interface {
	impl() Implementation
	// configure sets the private key and listen port.
	configure(key wgtypes.Key, port int) error
	// peers lists the configured peers: key, endpoint, allowed IPs.
	peers() ([]Peer, error)
	// setPeers removes peers and adds or updates others, leaving the
	// sessions of updated ones alone.
	setPeers(remove []wgtypes.Key, upsert []Peer) error
	// close stops the process's side; the link stays.
	close() error
}

// Runner runs fn in the network namespace the device belongs to: the
// sockets fn opens (the tunnel's UDP socket, netlink) are created there.
// nil runs fn where the calling thread is.
type Runner func(fn func() error) error

func (r Runner) run(fn func() error) error {
	if r == nil {
		return fn()
	}
	return r(fn)
}

// openDevice finds or creates the link and attaches to it.
func openDevice(name string, mtu int, want Implementation, in Runner, logf func(string, ...any)) (device, error) {
	var existing netlink.Link
	if err := in.run(func() (err error) {
		existing, err = netlink.LinkByName(name)
		if errors.As(err, &netlink.LinkNotFoundError{}) {
			return nil
		}
		return err
	}); err != nil {
		return nil, err
	}
	if existing != nil {
		switch existing.Type() {
		case "wireguard":
			if want == Userspace {
				return nil, fmt.Errorf("link %s is a kernel WireGuard device, but userspace was asked for", name)
			}
			return openKernel(name, mtu, in)
		case "tuntap":
			if want == Kernel {
				return nil, fmt.Errorf("link %s is a userspace (TUN) WireGuard device, but kernel was asked for", name)
			}
			return openUserspace(name, mtu, in, logf)
		default:
			return nil, fmt.Errorf("link %s exists and is a %s, not WireGuard", name, existing.Type())
		}
	}
	if want != Userspace {
		d, err := openKernel(name, mtu, in)
		if err == nil || want == Kernel {
			return d, err
		}
		if !errors.Is(err, unix.EOPNOTSUPP) {
			return nil, err
		}
	}
	return openUserspace(name, mtu, in, logf)
}

// kernelDevice is the kernel module's device.
type kernelDevice struct {
	name   string
	client *wgctrl.Client
	in     Runner
}

// openKernel creates the link (EOPNOTSUPP when the kernel has no
// WireGuard) or adopts it.
func openKernel(name string, mtu int, in Runner) (device, error) {
	d := &kernelDevice{name: name, in: in}
	err := in.run(func() error {
		if _, err := netlink.LinkByName(name); err != nil {
			attrs := netlink.NewLinkAttrs()
			attrs.Name, attrs.MTU = name, mtu
			if err := netlink.LinkAdd(&netlink.Wireguard{LinkAttrs: attrs}); err != nil {
				return fmt.Errorf("creating kernel WireGuard device %s: %w", name, err)
			}
		}
		c, err := wgctrl.New()
		d.client = c
		return err
	})
	if err != nil {
		return nil, err
	}
	return d, nil
}

func (d *kernelDevice) impl() Implementation { return Kernel }

func (d *kernelDevice) configure(key wgtypes.Key, port int) error {
	return d.client.ConfigureDevice(d.name, wgtypes.Config{PrivateKey: &key, ListenPort: &port})
}

func (d *kernelDevice) peers() ([]Peer, error) {
	dev, err := d.client.Device(d.name)
	if err != nil {
		return nil, err
	}
	out := make([]Peer, 0, len(dev.Peers))
	for _, p := range dev.Peers {
		peer := Peer{PublicKey: p.PublicKey}
		if p.Endpoint != nil {
			peer.Endpoint = p.Endpoint.AddrPort()
		}
		for _, n := range p.AllowedIPs {
			a, _ := netip.AddrFromSlice(n.IP)
			ones, _ := n.Mask.Size()
			peer.AllowedIPs = append(peer.AllowedIPs, netip.PrefixFrom(a.Unmap(), ones))
		}
		out = append(out, peer)
	}
	return out, nil
}

func (d *kernelDevice) setPeers(remove []wgtypes.Key, upsert []Peer) error {
	var cfg wgtypes.Config
	for _, k := range remove {
		cfg.Peers = append(cfg.Peers, wgtypes.PeerConfig{PublicKey: k, Remove: true})
	}
	for _, p := range upsert {
		pc := wgtypes.PeerConfig{
			PublicKey:         p.PublicKey,
			Endpoint:          net.UDPAddrFromAddrPort(p.Endpoint),
			ReplaceAllowedIPs: true,
		}
		for _, a := range p.AllowedIPs {
			pc.AllowedIPs = append(pc.AllowedIPs, net.IPNet{IP: a.Addr().AsSlice(), Mask: net.CIDRMask(a.Bits(), a.Addr().BitLen())})
		}
		cfg.Peers = append(cfg.Peers, pc)
	}
	return d.client.ConfigureDevice(d.name, cfg)
}

func (d *kernelDevice) close() error { return d.client.Close() }

// userspaceDevice is wireguard-go over a persistent TUN device.
type userspaceDevice struct {
	dev *wgdevice.Device
}

func openUserspace(name string, mtu int, in Runner, logf func(string, ...any)) (device, error) {
	var t tun.Device
	err := in.run(func() (err error) {
		t, err = tun.CreateTUN(name, mtu)
		if err != nil {
			return fmt.Errorf("creating TUN device %s for userspace WireGuard: %w", name, err)
		}
		if err := unix.IoctlSetInt(int(t.File().Fd()), unix.TUNSETPERSIST, 1); err != nil {
			t.Close()
			return fmt.Errorf("making TUN device %s persistent: %w", name, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	logger := &wgdevice.Logger{
		Verbosef: func(string, ...any) {},
		Errorf:   func(f string, a ...any) { logf("wireguard-go: "+f, a...) },
	}
	return &userspaceDevice{dev: wgdevice.NewDevice(nsTun{t, in}, nsBind{conn.NewDefaultBind(), in}, logger)}, nil
}

func (d *userspaceDevice) impl() Implementation { return Userspace }

func (d *userspaceDevice) configure(key wgtypes.Key, port int) error {
	return d.dev.IpcSet(fmt.Sprintf("private_key=%s\nlisten_port=%d\n", hex.EncodeToString(key[:]), port))
}

func (d *userspaceDevice) peers() ([]Peer, error) {
	out, err := d.dev.IpcGet()
	if err != nil {
		return nil, err
	}
	// The UAPI's get: a public_key line opens each peer, its endpoint and
	// allowed_ip lines follow.
	var peers []Peer
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), "=")
		var err error
		switch {
		case k == "public_key":
			b, herr := hex.DecodeString(v)
			if herr != nil || len(b) != wgtypes.KeyLen {
				return nil, fmt.Errorf("reading the device's peers: bad key %q", v)
			}
			peers = append(peers, Peer{PublicKey: wgtypes.Key(b)})
		case len(peers) == 0:
		case k == "endpoint":
			peers[len(peers)-1].Endpoint, err = netip.ParseAddrPort(v)
		case k == "allowed_ip":
			var p netip.Prefix
			p, err = netip.ParsePrefix(v)
			peers[len(peers)-1].AllowedIPs = append(peers[len(peers)-1].AllowedIPs, p)
		}
		if err != nil {
			return nil, fmt.Errorf("reading the device's peers: %s=%q: %w", k, v, err)
		}
	}
	return peers, nil
}

func (d *userspaceDevice) setPeers(remove []wgtypes.Key, upsert []Peer) error {
	var b strings.Builder
	for _, k := range remove {
		fmt.Fprintf(&b, "public_key=%s\nremove=true\n", hex.EncodeToString(k[:]))
	}
	for _, p := range upsert {
		fmt.Fprintf(&b, "public_key=%s\nendpoint=%s\nreplace_allowed_ips=true\n", hex.EncodeToString(p.PublicKey[:]), p.Endpoint)
		for _, a := range p.AllowedIPs {
			fmt.Fprintf(&b, "allowed_ip=%s\n", a)
		}
	}
	if b.Len() == 0 {
		return nil
	}
	return d.dev.IpcSet(b.String())
}

func (d *userspaceDevice) close() error {
	d.dev.Close()
	return nil
}

// nsBind opens the tunnel's UDP sockets in the device's namespace, whatever
// goroutine brings the device up.
type nsBind struct {
	conn.Bind
	in Runner
}

func (b nsBind) Open(port uint16) (fns []conn.ReceiveFunc, actual uint16, err error) {
	err = b.in.run(func() (err error) {
		fns, actual, err = b.Bind.Open(port)
		return err
	})
	return fns, actual, err
}

// nsTun reads the TUN device's MTU (by name, through a socket) in the
// device's namespace.
type nsTun struct {
	tun.Device
	in Runner
}

func (t nsTun) MTU() (mtu int, err error) {
	err = t.in.run(func() (err error) {
		mtu, err = t.Device.MTU()
		return err
	})
	return mtu, err
}

// deleteLink removes the device, whichever implementation made it.
func deleteLink(name string) error {
	l, err := netlink.LinkByName(name)
	if errors.As(err, &netlink.LinkNotFoundError{}) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := netlink.LinkDel(l); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}
