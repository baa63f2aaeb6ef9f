package benchlab

import (
	"context"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/lab"
)

// AttachUnderlay links the namespace at ns to the lab's underlay bridge
// as lab members are (a veth vethName on the bridge, eth0 in ns with
// ip/24, the default route via the lab's external host), so that a proxy
// there reaches the API server.
func AttachUnderlay(ns, vethName string, ip netip.Addr) error {
	member, err := netns.GetFromPath(ns)
	if err != nil {
		return err
	}
	defer member.Close()
	err = netnsutil.Do(netnsutil.RunDir+"/"+lab.UnderlayNS, func() error {
		br, err := netlink.LinkByName(lab.UnderlayBr)
		if err != nil {
			return err
		}
		return netlink.LinkAdd(&netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: vethName, MasterIndex: br.Attrs().Index, Flags: net.FlagUp, TxQLen: -1},
			PeerName:      "eth0",
			PeerNamespace: netlink.NsFd(int(member)),
		})
	})
	if err != nil {
		return err
	}
	return netnsutil.Do(ns, func() error {
		eth, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(24, 32)}}
		if err := netlink.AddrAdd(eth, addr); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(eth); err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: lab.ExternalIP.AsSlice()})
	})
}

// EnsureNode creates Node name (unless it exists) with InternalIP ip, so
// that kube-proxy finds its node IP at once. Nothing keeps it Ready; the
// proxies do not need that.
func EnsureNode(ctx context.Context, c kubernetes.Interface, name, ip string) error {
	_, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeHostName, Address: name}}
		_, err = c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
}
