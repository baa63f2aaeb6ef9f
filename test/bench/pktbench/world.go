package main

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/lab"
	"github.com/weftnet/weft/test/bench/benchlab"
)

// The address plan, stated once. Each subject gets a fresh world of
// namespaces (a proxy's rules, conntrack hooks and pins go with it):
//
//	gen  eth0 192.168.50.2/24 ---- up0 192.168.50.1/24  node1 (the measured node; NodePorts on 192.168.50.1)
//	gen  eth1 192.168.70.2/24 ---- cl0 192.168.70.1/24  node2 (the client network reached from node2 directly: DSR replies)
//	node1 n2 192.168.60.1/24  ---- n1  192.168.60.2/24  node2 (host-gw: node1 routes 10.244.2.0/24 via 192.168.60.2)
//	node1 cbr0 10.244.1.1/24: local pods 10.244.1.2.. (veth ports of the bridge)
//	node2 cbr0 10.244.2.1/24: remote pods 10.244.2.2..
//	node1, node2 eth0: the lab's underlay (172.18.0.x), for the API server
//	gen  eth2 (no address) ---- eth0 sink (drops every IPv4 packet at its
//	                            ingress: the baseline runs' target)
//
// Namespace names carry the lab's prefix, so lab.Down removes what a
// crashed run left.
var (
	genUplinkIP   = netip.MustParseAddr("192.168.50.2")
	node1IP       = netip.MustParseAddr("192.168.50.1") // the Node's InternalIP, the NodePort address
	genDirectIP   = netip.MustParseAddr("192.168.70.2")
	node2ClientIP = netip.MustParseAddr("192.168.70.1")
	node1LinkIP   = netip.MustParseAddr("192.168.60.1")
	node2IP       = netip.MustParseAddr("192.168.60.2") // node2's InternalIP
	clientNet     = netip.MustParsePrefix("192.168.50.0/24")
	node1PodCIDR  = netip.MustParsePrefix("10.244.1.0/24")
	node2PodCIDR  = netip.MustParsePrefix("10.244.2.0/24")
)

const (
	genDev      = "eth0" // the generator's uplink toward node1
	genSinkDev  = "eth2" // the generator's link to the sink
	uplinkDev   = "up0"  // node1's uplink
	node2Uplink = "n1"   // node2's link toward node1
	node2Client = "cl0"  // node2's link toward the client (DSR replies leave by it)
	podDev      = "eth0" // a pod's interface
	bridgeDev   = "cbr0"
)

// pod is one backend: its namespace and address, on node1 (local) or node2.
type pod struct {
	name, path string
	ip         netip.Addr
	local      bool
}

// world is one subject's namespaces.
type world struct {
	idx                 int
	gen, node1, node2   string // namespace paths
	names               []string
	pods                []pod
	genMAC, uplinkMAC   string
	genSinkMAC, sinkMAC string
	sink                string     // the baseline runs' namespace
	node1UL, node2UL    netip.Addr // underlay addresses
}

// plan is the backends: local pods l0.. at 10.244.1.2.. on node1,
// remote pods r0.. at 10.244.2.2.. on node2 (namespaces not made yet).
func plan(local, remote int) []pod {
	var out []pod
	for _, n := range []struct {
		cidr  netip.Prefix
		count int
		local bool
		name  string
	}{{node1PodCIDR, local, true, "l"}, {node2PodCIDR, remote, false, "r"}} {
		ip := n.cidr.Addr().Next() // the bridge's
		for i := range n.count {
			ip = ip.Next()
			out = append(out, pod{name: fmt.Sprintf("%s%d", n.name, i), ip: ip, local: n.local})
		}
	}
	return out
}

func nsName(idx int, what string) string { return fmt.Sprintf("%spkt%d-%s", lab.NSPrefix, idx, what) }

// newWorld builds world number idx with local and remote backends.
func newWorld(idx, local, remote int) (w *world, err error) {
	if idx > 24 {
		return nil, errors.New("out of underlay addresses")
	}
	w = &world{idx: idx,
		node1UL: netip.AddrFrom4([4]byte{172, 18, 0, byte(150 + 2*idx)}),
		node2UL: netip.AddrFrom4([4]byte{172, 18, 0, byte(151 + 2*idx)})}
	defer func() {
		if err != nil {
			w.close()
		}
	}()
	mk := func(what string) (string, error) {
		name := nsName(idx, what)
		p, err := netnsutil.NewNamed(name)
		if err != nil {
			return "", err
		}
		w.names = append(w.names, name)
		// No IPv6: no router solicitations or DAD in the counters.
		return p, netnsutil.Do(p, func() error {
			for _, k := range []string{"all", "default"} {
				if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+k+"/disable_ipv6", []byte("1"), 0o644); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if w.gen, err = mk("gen"); err != nil {
		return w, err
	}
	if w.node1, err = mk("n1"); err != nil {
		return w, err
	}
	if w.node2, err = mk("n2"); err != nil {
		return w, err
	}
	if w.sink, err = mk("sink"); err != nil {
		return w, err
	}
	if err := veth(w.gen, genSinkDev, netip.Addr{}, w.sink, "eth0", netip.Addr{}, 0); err != nil {
		return w, err
	}
	for _, p := range []string{w.node1, w.node2} {
		if err := sysctls(p, map[string]string{"net/ipv4/ip_forward": "1"}); err != nil {
			return w, err
		}
	}
	// The generator takes replies on either link (DSR replies come from
	// node2 with node1's address as source).
	if err := sysctls(w.gen, map[string]string{"net/ipv4/conf/all/rp_filter": "0", "net/ipv4/conf/default/rp_filter": "0"}); err != nil {
		return w, err
	}
	if err := veth(w.gen, genDev, genUplinkIP, w.node1, uplinkDev, node1IP, 24); err != nil {
		return w, err
	}
	if err := veth(w.gen, "eth1", genDirectIP, w.node2, node2Client, node2ClientIP, 24); err != nil {
		return w, err
	}
	if err := veth(w.node1, "n2", node1LinkIP, w.node2, node2Uplink, node2IP, 24); err != nil {
		return w, err
	}
	for i, n := range []struct {
		path string
		ip   netip.Addr
		veth string
	}{{w.node1, w.node1UL, fmt.Sprintf("ul-pk%da", idx)}, {w.node2, w.node2UL, fmt.Sprintf("ul-pk%db", idx)}} {
		if err := benchlab.AttachUnderlay(n.path, n.veth, n.ip); err != nil {
			return w, fmt.Errorf("attaching node%d to the underlay: %w", i+1, err)
		}
	}
	// The probe of the routing reference dials the pods themselves.
	if err := route(w.gen, netip.MustParsePrefix(lab.ClusterCIDR), node1IP); err != nil {
		return w, err
	}
	if err := route(w.node1, node2PodCIDR, node2IP); err != nil {
		return w, err
	}
	if err := route(w.node2, node1PodCIDR, node1LinkIP); err != nil {
		return w, err
	}
	if err := route(w.node2, clientNet, genDirectIP); err != nil {
		return w, err
	}
	for _, n := range []struct {
		path string
		cidr netip.Prefix
	}{{w.node1, node1PodCIDR}, {w.node2, node2PodCIDR}} {
		if err := bridge(n.path, n.cidr.Addr().Next(), n.cidr.Bits()); err != nil {
			return w, err
		}
	}
	for _, p := range plan(local, remote) {
		node, cidr := w.node2, node2PodCIDR
		if p.local {
			node, cidr = w.node1, node1PodCIDR
		}
		if p.path, err = mk(p.name); err != nil {
			return w, err
		}
		if err := podOnBridge(node, "v"+p.name, p.path, p.ip, cidr.Addr().Next(), cidr.Bits()); err != nil {
			return w, fmt.Errorf("pod %s: %w", p.name, err)
		}
		w.pods = append(w.pods, p)
	}
	if w.genMAC, err = macOf(w.gen, genDev); err != nil {
		return w, err
	}
	if w.uplinkMAC, err = macOf(w.node1, uplinkDev); err != nil {
		return w, err
	}
	if w.genSinkMAC, err = macOf(w.gen, genSinkDev); err != nil {
		return w, err
	}
	if w.sinkMAC, err = macOf(w.sink, "eth0"); err != nil {
		return w, err
	}
	return w, nil
}

// close deletes the world's namespaces; their links go with them.
func (w *world) close() {
	for _, n := range w.names {
		_ = netnsutil.Delete(n)
	}
	w.names = nil
}

func sysctls(ns string, kv map[string]string) error {
	return netnsutil.Do(ns, func() error {
		for k, v := range kv {
			if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
				return err
			}
		}
		return nil
	})
}

// veth links the namespaces a and b: aDev with aIP in a, bDev with bIP in b.
func veth(a, aDev string, aIP netip.Addr, b, bDev string, bIP netip.Addr, bits int) error {
	peer, err := netns.GetFromPath(b)
	if err != nil {
		return err
	}
	defer peer.Close()
	err = netnsutil.Do(a, func() error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: aDev, TxQLen: -1},
			PeerName: bDev, PeerNamespace: netlink.NsFd(int(peer))})
	})
	if err != nil {
		return fmt.Errorf("veth %s/%s: %w", aDev, bDev, err)
	}
	if err := addrUp(a, aDev, aIP, bits); err != nil {
		return err
	}
	return addrUp(b, bDev, bIP, bits)
}

// addrUp gives dev in ns the address ip/bits (none if ip is invalid) and
// sets it up.
func addrUp(ns, dev string, ip netip.Addr, bits int) error {
	return netnsutil.Do(ns, func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		if ip.IsValid() {
			if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(bits, 32)}}); err != nil {
				return fmt.Errorf("%s: %w", dev, err)
			}
		}
		return netlink.LinkSetUp(l)
	})
}

func route(ns string, dst netip.Prefix, gw netip.Addr) error {
	return netnsutil.Do(ns, func() error {
		r := &netlink.Route{Gw: gw.AsSlice()}
		if dst.Bits() > 0 {
			r.Dst = &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), 32)}
		}
		if err := netlink.RouteAdd(r); err != nil {
			return fmt.Errorf("route %v via %v: %w", dst, gw, err)
		}
		return nil
	})
}

// bridge makes the pod bridge in ns with the pods' gateway address.
func bridge(ns string, gw netip.Addr, bits int) error {
	err := netnsutil.Do(ns, func() error {
		return netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: bridgeDev}})
	})
	if err != nil {
		return err
	}
	return addrUp(ns, bridgeDev, gw, bits)
}

// podOnBridge wires the pod at podNS: host veth hostDev a port of the
// node's bridge, the pod's eth0 with ip and a default route via gw.
func podOnBridge(node, hostDev, podNS string, ip, gw netip.Addr, bits int) error {
	err := netnsutil.Do(node, func() error {
		return netnsutil.BridgedVeth(hostDev, bridgeDev, podNS, podDev, 1500)
	})
	if err != nil {
		return err
	}
	if err := addrUp(podNS, podDev, ip, bits); err != nil {
		return err
	}
	return route(podNS, netip.Prefix{}, gw)
}

func macOf(ns, dev string) (string, error) {
	var mac string
	err := netnsutil.Do(ns, func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		mac = l.Attrs().HardwareAddr.String()
		return nil
	})
	return mac, err
}
