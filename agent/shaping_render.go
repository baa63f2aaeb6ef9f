package agent

import (
	"golang.org/x/sys/unix"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"

	"github.com/weftnet/weft/topology"
)

// weft's traffic shaping objects: the TBF qdiscs carry handle 0x7766
// ("wf") at the root of the host veth (traffic to the pod) and of the
// pod's IFB (traffic from it); the redirect is a u32 filter matching
// every packet, of that priority, on the veth's clsact ingress hook (u32:
// the classifier every kernel builds in; matchall, basic and flower may
// be modules or missing).
const (
	shapeHandleMajor = 0x7766
	redirectPriority = 0x7766
)

// tcShape is one attachment's shaping as netlink objects.
type tcShape struct {
	toPod    *netlink.Tbf    // root of the host veth
	fromPod  *netlink.Tbf    // root of the IFB
	clsact   *netlink.Clsact // on the host veth
	redirect *netlink.U32    // veth ingress -> IFB
}

// renderShape turns a shape into the netlink objects for the host veth
// and IFB of those link indexes.
func renderShape(s topology.Shape, vethIdx, ifbIdx int) tcShape {
	tbf := func(idx int) *netlink.Tbf {
		return &netlink.Tbf{
			QdiscAttrs: netlink.QdiscAttrs{LinkIndex: idx, Handle: netlink.MakeHandle(shapeHandleMajor, 0), Parent: netlink.HANDLE_ROOT},
			Rate:       s.RateBytes, Limit: s.Limit, Buffer: netlink.Xmittime(s.RateBytes, s.Burst),
		}
	}
	return tcShape{
		toPod:   tbf(vethIdx),
		fromPod: tbf(ifbIdx),
		clsact:  &netlink.Clsact{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: vethIdx, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}},
		redirect: &netlink.U32{
			FilterAttrs: netlink.FilterAttrs{LinkIndex: vethIdx, Parent: netlink.HANDLE_MIN_INGRESS, Priority: redirectPriority,
				Protocol: unix.ETH_P_ALL},
			Sel:     &netlink.TcU32Sel{Flags: nl.TC_U32_TERMINAL, Nkeys: 1, Keys: []netlink.TcU32Key{{Mask: 0, Val: 0, Off: 0}}},
			Actions: []netlink.Action{netlink.NewMirredAction(ifbIdx)},
		},
	}
}
