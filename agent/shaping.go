package agent

import (
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/weftnet/weft/cni"
	"github.com/weftnet/weft/internal/nlutil"
	"github.com/weftnet/weft/topology"
)

// shaper applies the pods' traffic shapes to their host veths and IFBs.
// It remembers what it applied (by link index, so a recreated veth is
// shaped again): a sync that is not full touches only shapes that are
// new, changed or whose links changed, and the IFBs of shapes gone; a
// full sync (start, resync) checks every shape in the kernel and removes
// weft's shaping from every host veth that should have none.
type shaper struct {
	applied map[string]appliedShape // by host veth
}

type appliedShape struct {
	shape           topology.Shape
	vethIdx, ifbIdx int
}

func newShaper() *shaper { return &shaper{applied: map[string]appliedShape{}} }

// apply brings the kernel to the shapes. missing counts shapes whose host
// veth does not exist (yet): the caller retries them.
func (s *shaper) apply(want []topology.Shape, full bool) (missing int, err error) {
	links, err := nlutil.Dump("links", netlink.LinkList)
	if err != nil {
		return 0, err
	}
	byName := make(map[string]netlink.Link, len(links))
	for _, l := range links {
		byName[l.Attrs().Name] = l
	}
	wanted := make(map[string]bool, len(want))
	var errs []error
	for _, sh := range want {
		wanted[sh.HostVeth] = true
		veth := byName[sh.HostVeth]
		if veth == nil {
			missing++
			continue
		}
		if a, ok := s.applied[sh.HostVeth]; !full && ok && a.shape == sh && a.vethIdx == veth.Attrs().Index &&
			byName[sh.IFB] != nil && byName[sh.IFB].Attrs().Index == a.ifbIdx {
			continue
		}
		ifbIdx, err := ensureShape(sh, veth, byName[sh.IFB])
		if err != nil {
			delete(s.applied, sh.HostVeth)
			errs = append(errs, fmt.Errorf("shaping pod %s on %s: %w", sh.Pod, sh.HostVeth, err))
			continue
		}
		s.applied[sh.HostVeth] = appliedShape{shape: sh, vethIdx: veth.Attrs().Index, ifbIdx: ifbIdx}
	}
	for _, l := range links {
		name := l.Attrs().Name
		switch {
		case isIFBName(name) && !wanted[cni.HostVethPrefix+name[len(topology.IFBPrefix):]]:
			if err := netlink.LinkDel(l); err != nil && !errors.Is(err, netlink.ErrNotImplemented) {
				errs = append(errs, fmt.Errorf("deleting IFB %s: %w", name, err))
			}
		case !wanted[name] && (full || s.applied[name] != appliedShape{}) && isHostVeth(name):
			if err := unshape(l); err != nil {
				errs = append(errs, fmt.Errorf("removing the shaping of %s: %w", name, err))
			}
		}
	}
	for name := range s.applied {
		if !wanted[name] {
			delete(s.applied, name)
		}
	}
	return missing, errors.Join(errs...)
}

// hostVethLen is the length of every host veth name.
var hostVethLen = len(cni.HostVethName("", ""))

// isHostVeth reports whether name has the shape of a pod's host veth (not
// the bridge weft0, nor weft.vxlan).
func isHostVeth(name string) bool {
	return strings.HasPrefix(name, cni.HostVethPrefix) && len(name) == hostVethLen
}

// isIFBName reports whether name is one IFBName makes.
func isIFBName(name string) bool {
	return strings.HasPrefix(name, topology.IFBPrefix) && len(name) == len(topology.IFBPrefix)+hostVethLen-len(cni.HostVethPrefix)
}

// ensureShape makes the IFB if needed and puts the shape's qdiscs and
// redirect in place; it returns the IFB's index.
func ensureShape(sh topology.Shape, veth, ifb netlink.Link) (int, error) {
	mtu := veth.Attrs().MTU
	if ifb == nil {
		if err := netlink.LinkAdd(&netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: sh.IFB, MTU: mtu, TxQLen: 1000}}); err != nil {
			return 0, fmt.Errorf("adding IFB %s: %w", sh.IFB, err)
		}
		var err error
		if ifb, err = netlink.LinkByName(sh.IFB); err != nil {
			return 0, err
		}
	}
	if ifb.Attrs().MTU != mtu {
		if err := netlink.LinkSetMTU(ifb, mtu); err != nil {
			return 0, fmt.Errorf("setting the MTU of %s: %w", sh.IFB, err)
		}
	}
	if ifb.Attrs().Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(ifb); err != nil {
			return 0, fmt.Errorf("setting %s up: %w", sh.IFB, err)
		}
	}
	tc := renderShape(sh, veth.Attrs().Index, ifb.Attrs().Index)
	for _, q := range []*netlink.Tbf{tc.toPod, tc.fromPod} {
		if err := ensureTbf(q); err != nil {
			return 0, err
		}
	}
	if err := ensureClsact(tc.clsact); err != nil {
		return 0, err
	}
	if err := ensureRedirect(tc.redirect, ifb.Attrs().Index); err != nil {
		return 0, err
	}
	return ifb.Attrs().Index, nil
}

func qdiscs(idx int) ([]netlink.Qdisc, error) {
	return nlutil.Dump("qdiscs", func() ([]netlink.Qdisc, error) {
		return netlink.QdiscList(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: idx}})
	})
}

// ensureTbf replaces the root qdisc with want unless weft's TBF of the
// same rate and queue is there already.
func ensureTbf(want *netlink.Tbf) error {
	list, err := qdiscs(want.LinkIndex)
	if err != nil {
		return err
	}
	for _, q := range list {
		if t, ok := q.(*netlink.Tbf); ok && t.Handle == want.Handle && t.Parent == netlink.HANDLE_ROOT && t.Rate == want.Rate && t.Limit == want.Limit {
			return nil
		}
	}
	if err := netlink.QdiscReplace(want); err != nil {
		return fmt.Errorf("tbf on link %d: %w", want.LinkIndex, err)
	}
	return nil
}

// ensureClsact adds the clsact qdisc unless one is there (another
// program's filters on it stay).
func ensureClsact(want *netlink.Clsact) error {
	list, err := qdiscs(want.LinkIndex)
	if err != nil {
		return err
	}
	for _, q := range list {
		if q.Type() == "clsact" {
			return nil
		}
	}
	if err := netlink.QdiscAdd(want); err != nil {
		return fmt.Errorf("clsact on link %d: %w", want.LinkIndex, err)
	}
	return nil
}

// ensureRedirect installs the veth's redirect to its IFB unless it is
// there already.
func ensureRedirect(want *netlink.U32, ifbIdx int) error {
	list, err := nlutil.Dump("filters", func() ([]netlink.Filter, error) {
		return netlink.FilterList(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: want.LinkIndex}}, netlink.HANDLE_MIN_INGRESS)
	})
	if err != nil {
		return err
	}
	for _, f := range list {
		m, ok := f.(*netlink.U32)
		if !ok || m.Priority != redirectPriority {
			continue
		}
		for _, a := range m.Actions {
			if r, ok := a.(*netlink.MirredAction); ok && r.Ifindex == ifbIdx {
				return nil
			}
		}
	}
	if err := netlink.FilterReplace(want); err != nil {
		return fmt.Errorf("redirect filter on link %d: %w", want.LinkIndex, err)
	}
	return nil
}

// unshape removes weft's root TBF and redirect from a host veth, if
// there; other qdiscs and filters stay.
func unshape(veth netlink.Link) error {
	idx := veth.Attrs().Index
	list, err := qdiscs(idx)
	if err != nil {
		return err
	}
	hasClsact := false
	for _, q := range list {
		hasClsact = hasClsact || q.Type() == "clsact"
		if t, ok := q.(*netlink.Tbf); ok && t.Handle == netlink.MakeHandle(shapeHandleMajor, 0) && t.Parent == netlink.HANDLE_ROOT {
			if err := netlink.QdiscDel(t); err != nil {
				return err
			}
		}
	}
	if !hasClsact {
		return nil
	}
	filters, err := nlutil.Dump("filters", func() ([]netlink.Filter, error) { return netlink.FilterList(veth, netlink.HANDLE_MIN_INGRESS) })
	if err != nil {
		return err
	}
	for _, f := range filters {
		if f.Attrs().Priority == redirectPriority {
			if err := netlink.FilterDel(f); err != nil {
				return err
			}
		}
	}
	return nil
}

// CleanupShaping removes every IFB and shaping weft made on the node.
func CleanupShaping() error {
	_, err := newShaper().apply(nil, true)
	return err
}
