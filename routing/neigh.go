package routing

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/nlutil"
)

// syncNeighbors makes the permanent IPv4 and IPv6 neighbour entries of the
// device at index exactly want. Entries the kernel resolved itself
// (non-permanent) are not weft's and stay, unless weft wants that address.
func (s *session) syncNeighbors(index int, want []Neighbor) []error {
	have := map[netip.Addr]netlink.Neigh{}
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		list, err := nlutil.Dump("neighbours", func() ([]netlink.Neigh, error) { return s.h.NeighList(index, fam) })
		if err != nil {
			return []error{err}
		}
		for _, n := range list {
			if n.State&unix.NUD_PERMANENT != 0 {
				ip, _ := netip.AddrFromSlice(n.IP)
				have[ip.Unmap()] = n
			}
		}
	}
	var errs []error
	for _, w := range want {
		cur, ok := have[w.IP]
		delete(have, w.IP)
		if ok && bytes.Equal(cur.HardwareAddr, w.MAC) {
			continue
		}
		fam := unix.AF_INET
		if w.IP.Is6() {
			fam = unix.AF_INET6
		}
		err := s.h.NeighSet(&netlink.Neigh{
			LinkIndex: index, Family: fam, State: unix.NUD_PERMANENT,
			IP: w.IP.AsSlice(), HardwareAddr: w.MAC,
		})
		errs = append(errs, wrap(w.String(), err))
	}
	for ip, n := range have {
		if err := s.h.NeighDel(&n); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("deleting stale neighbour %s lladdr %s: %w", ip, n.HardwareAddr, err))
		}
	}
	return errs
}

// fdbKey identifies one remote of one MAC in a VXLAN FDB.
type fdbKey struct {
	mac string
	dst netip.Addr
}

// syncFDB makes the permanent FDB entries of the VXLAN device at index
// exactly want. A wanted MAC whose entry points elsewhere is redirected in
// place (NLM_F_REPLACE); entries not wanted are deleted.
func (s *session) syncFDB(index int, want []FDBEntry) []error {
	list, err := nlutil.Dump("fdb", func() ([]netlink.Neigh, error) { return s.h.NeighList(index, unix.AF_BRIDGE) })
	if err != nil {
		return []error{err}
	}
	have := map[fdbKey]netlink.Neigh{}
	for _, n := range list {
		if n.State&unix.NUD_PERMANENT != 0 {
			ip, _ := netip.AddrFromSlice(n.IP)
			have[fdbKey{n.HardwareAddr.String(), ip.Unmap()}] = n
		}
	}
	var errs []error
	for _, w := range want {
		k := fdbKey{w.MAC.String(), w.Dst}
		if _, ok := have[k]; ok {
			delete(have, k)
			continue
		}
		errs = append(errs, wrap(w.String(), s.h.NeighSet(fdbNeigh(index, w.MAC, w.Dst.AsSlice()))))
	}
	for k, n := range have {
		// A replaced MAC's old remote is already gone: ENOENT is fine.
		err := s.h.NeighDel(fdbNeigh(index, n.HardwareAddr, n.IP))
		if err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("deleting stale fdb %s dst %s: %w", k.mac, k.dst, err))
		}
	}
	return errs
}

func fdbNeigh(index int, mac net.HardwareAddr, dst net.IP) *netlink.Neigh {
	return &netlink.Neigh{
		LinkIndex: index, Family: unix.AF_BRIDGE, State: unix.NUD_PERMANENT,
		Flags: netlink.NTF_SELF, IP: dst, HardwareAddr: mac,
	}
}
