package ipvs

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	libipvs "github.com/moby/ipvs"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/proxy/model"
)

// Kernel is the IPVS netlink interface the backend programs (a
// *libipvs.Handle, or a fake in tests).
type Kernel interface {
	GetServices() ([]*libipvs.Service, error)
	GetDestinations(*libipvs.Service) ([]*libipvs.Destination, error)
	NewService(*libipvs.Service) error
	UpdateService(*libipvs.Service) error
	DelService(*libipvs.Service) error
	NewDestination(*libipvs.Service, *libipvs.Destination) error
	UpdateDestination(*libipvs.Service, *libipvs.Destination) error
	DelDestination(*libipvs.Service, *libipvs.Destination) error
}

// The service flags the backend sets and compares (the kernel adds
// IP_VS_SVC_F_HASHED to what it reports).
const (
	svcPersistent = 0x1
	svcFlagsMask  = svcPersistent
)

// appliedVS is a virtual server as programmed, with the weight of each
// real server (0: terminating).
type appliedVS struct {
	vs    *VirtualServer
	dests map[Dest]int
}

// destKey names a real server of a virtual server.
type destKey struct {
	vs   VSKey
	dest Dest
}

// toService is the netlink form of v.
func toService(k VSKey, sched string, timeout uint32) *libipvs.Service {
	s := &libipvs.Service{Address: net.IP(k.Addr.AsSlice()), Protocol: protoNum(k.Proto), Port: k.Port, SchedName: sched,
		AddressFamily: unix.AF_INET, Netmask: 0xffffffff}
	if k.Addr.Is6() {
		s.AddressFamily, s.Netmask = unix.AF_INET6, 128
	}
	if timeout > 0 {
		s.Flags, s.Timeout = svcPersistent, timeout
	}
	return s
}

func toDest(d Dest, weight int) *libipvs.Destination {
	fam := uint16(unix.AF_INET)
	if d.Addr.Is6() {
		fam = unix.AF_INET6
	}
	return &libipvs.Destination{Address: net.IP(d.Addr.AsSlice()), Port: d.Port, Weight: weight,
		ConnectionFlags: libipvs.ConnFwdMasq, AddressFamily: fam}
}

func protoNum(p model.Protocol) uint16 {
	switch p {
	case model.UDP:
		return unix.IPPROTO_UDP
	case model.SCTP:
		return unix.IPPROTO_SCTP
	}
	return unix.IPPROTO_TCP
}

func protoName(n uint16) (model.Protocol, bool) {
	switch n {
	case unix.IPPROTO_TCP:
		return model.TCP, true
	case unix.IPPROTO_UDP:
		return model.UDP, true
	case unix.IPPROTO_SCTP:
		return model.SCTP, true
	}
	return "", false
}

func addrOf(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

// readKernel returns the virtual servers of the kernel whose address owned
// accepts, with their real servers.
func readKernel(k Kernel, owned func(netip.Addr) bool) (map[VSKey]*appliedVS, error) {
	svcs, err := k.GetServices()
	if err != nil {
		return nil, fmt.Errorf("listing IPVS virtual servers: %w", err)
	}
	out := map[VSKey]*appliedVS{}
	for _, s := range svcs {
		proto, ok := protoName(s.Protocol)
		if !ok || s.FWMark != 0 {
			continue
		}
		key := VSKey{Addr: addrOf(s.Address), Proto: proto, Port: s.Port}
		if !owned(key.Addr) {
			continue
		}
		vs := &VirtualServer{VSKey: key, Scheduler: s.SchedName}
		if s.Flags&svcPersistent != 0 {
			vs.Timeout = s.Timeout
		}
		dests, err := k.GetDestinations(s)
		if err != nil {
			return nil, fmt.Errorf("listing the real servers of IPVS virtual server %s: %w", key, err)
		}
		a := &appliedVS{vs: vs, dests: map[Dest]int{}}
		for _, d := range dests {
			a.dests[Dest{Addr: addrOf(d.Address), Port: d.Port}] = d.Weight
		}
		out[key] = a
	}
	return out, nil
}

// ipvsPlan applies the difference between applied and want to k, updating
// applied as it goes (so that a failure leaves it true to the kernel).
// Real servers that leave a TCP or SCTP virtual server get weight 0 and are
// recorded in terminating with their deadline; UDP ones go at once (a
// datagram flow has no end to wait for; the next datagram of a flow to a
// removed real server is rescheduled, net.ipv4.vs.expire_nodest_conn).
type ipvsPlan struct {
	k           Kernel
	applied     map[VSKey]*appliedVS
	terminating map[destKey]time.Time
	grace       time.Duration
	now         time.Time
}

func (p *ipvsPlan) apply(want map[VSKey]*VirtualServer) error {
	for key, vs := range want {
		cur := p.applied[key]
		svc := toService(key, vs.Scheduler, vs.Timeout)
		switch {
		case cur == nil:
			if err := p.k.NewService(svc); err != nil {
				return fmt.Errorf("creating IPVS virtual server %s (service %s, scheduler %s): %w", key, vs.Service, vs.Scheduler, err)
			}
			cur = &appliedVS{vs: vs, dests: map[Dest]int{}}
			p.applied[key] = cur
		case !cur.vs.equalService(vs):
			if err := p.k.UpdateService(svc); err != nil {
				return fmt.Errorf("updating IPVS virtual server %s (service %s, scheduler %s): %w", key, vs.Service, vs.Scheduler, err)
			}
		}
		// Unchanged real servers, none terminating: nothing to do.
		same := len(cur.dests) == len(vs.Dests) && slices.Equal(cur.vs.Dests, vs.Dests)
		cur.vs = vs
		if same {
			continue
		}
		if err := p.dests(svc, cur); err != nil {
			return err
		}
	}
	for key, cur := range p.applied {
		if _, ok := want[key]; ok {
			continue
		}
		if err := p.k.DelService(toService(key, cur.vs.Scheduler, cur.vs.Timeout)); err != nil {
			return fmt.Errorf("deleting IPVS virtual server %s: %w", key, err)
		}
		delete(p.applied, key)
		for d := range cur.dests {
			delete(p.terminating, destKey{key, d})
		}
	}
	return nil
}

// dests makes the real servers of one virtual server those of cur.vs.
func (p *ipvsPlan) dests(svc *libipvs.Service, cur *appliedVS) error {
	key := cur.vs.VSKey
	want := map[Dest]bool{}
	for _, d := range cur.vs.Dests {
		want[d] = true
		w, ok := cur.dests[d]
		switch {
		case !ok:
			if err := p.k.NewDestination(svc, toDest(d, 1)); err != nil {
				return fmt.Errorf("adding real server %s to IPVS virtual server %s (service %s): %w", d, key, cur.vs.Service, err)
			}
		case w == 0: // terminating, and back
			if err := p.k.UpdateDestination(svc, toDest(d, 1)); err != nil {
				return fmt.Errorf("restoring real server %s of IPVS virtual server %s (service %s): %w", d, key, cur.vs.Service, err)
			}
		default:
			continue
		}
		cur.dests[d] = 1
		delete(p.terminating, destKey{key, d})
	}
	for d, w := range cur.dests {
		if want[d] {
			continue
		}
		dk := destKey{key, d}
		if key.Proto == model.UDP {
			if err := p.del(svc, cur, d); err != nil {
				return err
			}
			continue
		}
		if w != 0 {
			if err := p.k.UpdateDestination(svc, toDest(d, 0)); err != nil {
				return fmt.Errorf("quiescing real server %s of IPVS virtual server %s: %w", d, key, err)
			}
			cur.dests[d] = 0
		}
		if _, ok := p.terminating[dk]; !ok {
			p.terminating[dk] = p.now.Add(p.grace)
		}
	}
	return nil
}

func (p *ipvsPlan) del(svc *libipvs.Service, cur *appliedVS, d Dest) error {
	if err := p.k.DelDestination(svc, toDest(d, 0)); err != nil {
		return fmt.Errorf("deleting real server %s of IPVS virtual server %s: %w", d, cur.vs.VSKey, err)
	}
	delete(cur.dests, d)
	delete(p.terminating, destKey{cur.vs.VSKey, d})
	return nil
}

// reap deletes the terminating real servers whose connections have ended
// or whose deadline has passed: one listing per virtual server that has
// any.
func (p *ipvsPlan) reap() error {
	byVS := map[VSKey][]Dest{}
	for dk := range p.terminating {
		byVS[dk.vs] = append(byVS[dk.vs], dk.dest)
	}
	for key, dests := range byVS {
		cur := p.applied[key]
		if cur == nil {
			for _, d := range dests {
				delete(p.terminating, destKey{key, d})
			}
			continue
		}
		svc := toService(key, cur.vs.Scheduler, cur.vs.Timeout)
		conns := map[Dest]int{}
		live, err := p.k.GetDestinations(svc)
		if err != nil {
			return fmt.Errorf("listing the real servers of IPVS virtual server %s: %w", key, err)
		}
		for _, l := range live {
			conns[Dest{Addr: addrOf(l.Address), Port: l.Port}] = l.ActiveConnections + l.InactiveConnections
		}
		for _, d := range dests {
			if conns[d] == 0 || !p.now.Before(p.terminating[destKey{key, d}]) {
				if err := p.del(svc, cur, d); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// countingKernel counts the netlink requests made through it.
type countingKernel struct {
	Kernel
	ops int
}

func (c *countingKernel) GetServices() ([]*libipvs.Service, error) {
	c.ops++
	return c.Kernel.GetServices()
}

func (c *countingKernel) GetDestinations(s *libipvs.Service) ([]*libipvs.Destination, error) {
	c.ops++
	return c.Kernel.GetDestinations(s)
}

func (c *countingKernel) NewService(s *libipvs.Service) error {
	c.ops++
	return c.Kernel.NewService(s)
}

func (c *countingKernel) UpdateService(s *libipvs.Service) error {
	c.ops++
	return c.Kernel.UpdateService(s)
}

func (c *countingKernel) DelService(s *libipvs.Service) error {
	c.ops++
	return c.Kernel.DelService(s)
}

func (c *countingKernel) NewDestination(s *libipvs.Service, d *libipvs.Destination) error {
	c.ops++
	return c.Kernel.NewDestination(s, d)
}

func (c *countingKernel) UpdateDestination(s *libipvs.Service, d *libipvs.Destination) error {
	c.ops++
	return c.Kernel.UpdateDestination(s, d)
}

func (c *countingKernel) DelDestination(s *libipvs.Service, d *libipvs.Destination) error {
	c.ops++
	return c.Kernel.DelDestination(s, d)
}
