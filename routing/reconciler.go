package routing

import (
	"errors"
	"fmt"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// RouteProtocol is the rtm_protocol that marks the routes weft owns (`ip
// route show proto 0x57`). 0x57 ('W') is assigned neither in the kernel's
// rtnetlink.h nor in iproute2's rt_protos, and no routing daemon we know of
// uses it.
const RouteProtocol = 0x57

// DeviceAlias is the interface alias (IFLA_IFALIAS) that marks the VXLAN
// and IPIP devices weft owns, so a later Apply or Cleanup finds them whatever their
// name.
const DeviceAlias = "weft-routing"

// Reconciler makes the kernel's routing state match a Desired, touching only
// what weft owns: routes with its route protocol and VXLAN devices with its
// alias (and the permanent neighbour and FDB entries on them). It keeps no
// state of its own between calls, so a new Reconciler (an agent restart)
// picks up where the old one left. It is safe for concurrent use.
type Reconciler struct {
	mu    sync.Mutex
	proto netlink.RouteProtocol
}

// Option configures a Reconciler.
type Option func(*Reconciler)

// WithRouteProtocol marks weft's routes with protocol p instead of
// RouteProtocol (for a second weft instance, or a clash with another
// daemon). p must not be one the kernel or a routing daemon on the node uses.
func WithRouteProtocol(p uint8) Option {
	return func(r *Reconciler) { r.proto = netlink.RouteProtocol(p) }
}

// NewReconciler returns a Reconciler.
func NewReconciler(opts ...Option) *Reconciler {
	r := &Reconciler{proto: RouteProtocol}
	for _, o := range opts {
		o(r)
	}
	return r
}

// Apply makes the network namespace of the calling thread match d for
// what weft owns: it adds what is missing, replaces what differs in place
// and deletes what is stale, and leaves what already matches untouched, so
// applying the same d again changes nothing in the kernel. VXLAN devices
// weft owns other than d.Device are deleted (with their routes), which is
// how a switch to host-gw cleans up. A bad entry does not stop the others;
// Apply returns all failures joined.
//
// A Desired without a valid Mode (the zero value that Compute returns for a
// bad Config) is refused without touching anything.
func (r *Reconciler) Apply(d Desired) error {
	if err := checkDesired(d); err != nil {
		return fmt.Errorf("applying routing state: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s, err := r.open()
	if err != nil {
		return err
	}
	defer s.close()
	var errs []error
	keep := ""
	links := map[string]int{} // device name -> index; -1: unusable
	if d.Device != nil {
		keep = d.Device.Name
		// A device that exists but could not be fixed entirely (say, its
		// MTU) still gets its entries; one that does not exist cannot.
		index, err := s.ensureDevice(*d.Device)
		errs = append(errs, err)
		if index > 0 {
			errs = append(errs, s.syncNeighbors(index, d.Neighbors)...)
			errs = append(errs, s.syncFDB(index, d.FDB)...)
		} else {
			index = -1
		}
		links[keep] = index
	}
	if d.IPIP != nil {
		keep = d.IPIP.Name
		index, err := s.ensureIPIP(*d.IPIP)
		errs = append(errs, err)
		if index <= 0 {
			index = -1
		}
		links[keep] = index
	}
	errs = append(errs, s.syncRoutes(d.Routes, links)...)
	errs = append(errs, s.deleteDevices(keep, false)...)
	return errors.Join(errs...)
}

// Cleanup removes everything weft owns from the calling thread's network
// namespace: its routes and its VXLAN devices (their neighbour and FDB
// entries go with them).
func (r *Reconciler) Cleanup() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, err := r.open()
	if err != nil {
		return err
	}
	defer s.close()
	errs := s.syncRoutes(nil, nil)
	errs = append(errs, s.deleteDevices("", false)...)
	return errors.Join(errs...)
}

func checkDesired(d Desired) error {
	switch {
	case d.Mode != ModeHostGW && d.Mode != ModeVXLAN && d.Mode != ModeIPIP:
		return fmt.Errorf("mode %q (a Desired not from Compute?): %w", d.Mode, ErrInvalid)
	case d.Mode == ModeVXLAN && d.Device == nil:
		return fmt.Errorf("vxlan mode without a device: %w", ErrMissing)
	case d.Mode != ModeVXLAN && d.Device != nil:
		return fmt.Errorf("%s mode with a vxlan device: %w", d.Mode, ErrInvalid)
	case (d.Mode == ModeIPIP) != (d.IPIP != nil):
		return fmt.Errorf("%s mode and an ipip device %v: %w", d.Mode, d.IPIP != nil, ErrInvalid)
	case d.IPIP != nil && (checkDevice(d.IPIP.Name) != nil || !d.IPIP.Local.Is4()):
		return fmt.Errorf("ipip device %q local %v: %w", d.IPIP.Name, d.IPIP.Local, ErrInvalid)
	case d.Device != nil:
		if err := checkDevice(d.Device.Name); err != nil {
			return fmt.Errorf("vxlan device: %w", err)
		}
		if err := checkMAC(d.Device.MAC); err != nil {
			return fmt.Errorf("vxlan device %s mac: %w", d.Device.Name, err)
		}
		if !d.Device.Local.IsValid() {
			return fmt.Errorf("vxlan device %s local address: %w", d.Device.Name, ErrMissing)
		}
	}
	return nil
}

// session is one Apply or Cleanup: a netlink handle opened in the calling
// thread's namespace, so every request of the session goes there.
type session struct {
	h     *netlink.Handle
	proto netlink.RouteProtocol
}

func (r *Reconciler) open() (*session, error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("opening netlink: %w", err)
	}
	return &session{h: h, proto: r.proto}, nil
}

func (s *session) close() { s.h.Close() }
