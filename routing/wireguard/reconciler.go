package wireguard

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/weftnet/weft/internal/nlutil"
)

// Options configure a Reconciler.
type Options struct {
	Device string         // DefaultDevice if empty
	Port   int            // DefaultPort if 0
	MTU    int            // the device's MTU; required
	Impl   Implementation // Auto if empty
	// In runs netlink and socket work in the node's namespace (tests run
	// several nodes in one process); nil: the calling thread's.
	In Runner
	// Logf receives the userspace implementation's errors.
	Logf func(format string, args ...any)
}

// Reconciler owns the node's WireGuard device, its peers, Table and the
// rules that consult it. Its private key is made in the process and never
// written anywhere but the device: every start (a new Reconciler) and every
// Rotate makes a new one.
type Reconciler struct {
	opts Options
	mu   sync.Mutex
	dev  device
	key  wgtypes.Key
}

// NewReconciler makes the node's key; the device is made by the first Apply.
func NewReconciler(o Options) (*Reconciler, error) {
	if o.Device == "" {
		o.Device = DefaultDevice
	}
	if o.Port == 0 {
		o.Port = DefaultPort
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	impl, err := ParseImplementation(string(o.Impl))
	if err != nil {
		return nil, err
	}
	o.Impl = impl
	if o.MTU < 1280 {
		return nil, fmt.Errorf("wireguard device MTU %d: below IPv6's minimum, 1280", o.MTU)
	}
	key, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		return nil, err
	}
	return &Reconciler{opts: o, key: key}, nil
}

// PublicKey is what the node publishes in PublicKeyAnnotation.
func (r *Reconciler) PublicKey() wgtypes.Key {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.key.PublicKey()
}

// Port is the UDP port the device listens on.
func (r *Reconciler) Port() int { return r.opts.Port }

// Implementation is the one in use: known after the first Apply.
func (r *Reconciler) Implementation() Implementation {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dev == nil {
		return ""
	}
	return r.dev.impl()
}

// Rotate puts a new private key on the device and returns its public key,
// to be published. The device switches at once; each peer's handshakes
// fail until it has read the new key, then its next packet makes one.
func (r *Reconciler) Rotate() (wgtypes.Key, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	key, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		return wgtypes.Key{}, err
	}
	if r.dev != nil {
		if err := r.dev.configure(key, r.opts.Port); err != nil {
			return wgtypes.Key{}, fmt.Errorf("new key on %s: %w", r.opts.Device, err)
		}
	}
	r.key = key
	return key.PublicKey(), nil
}

// Apply makes the device, its addresses, peers, Table and the rules match d.
// A peer, route or address that fails does not stop the others; every
// failure is returned, naming its object. Entries that already match are
// not rewritten.
func (r *Reconciler) Apply(d Desired) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dev == nil {
		dev, err := openDevice(r.opts.Device, r.opts.MTU, r.opts.Impl, r.opts.In, r.opts.Logf)
		if err != nil {
			return err
		}
		if err := dev.configure(r.key, r.opts.Port); err != nil {
			dev.close()
			return fmt.Errorf("configuring %s: %w", r.opts.Device, err)
		}
		r.dev = dev
	}
	var errs []error
	if err := r.applyPeers(d.Peers); err != nil {
		errs = append(errs, err)
	}
	if err := r.opts.In.run(func() error { return r.applyKernel(d) }); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// applyPeers removes the peers not wanted and writes only those that are
// new or differ: a resync rewrites nothing.
func (r *Reconciler) applyPeers(want []Peer) error {
	have, err := r.dev.peers()
	if err != nil {
		return fmt.Errorf("listing peers of %s: %w", r.opts.Device, err)
	}
	remove, upsert := PeerChanges(have, want)
	if len(remove) == 0 && len(upsert) == 0 {
		return nil
	}
	if err := r.dev.setPeers(remove, upsert); err != nil {
		return fmt.Errorf("peers of %s: %w", r.opts.Device, err)
	}
	return nil
}

// PeerChanges is what turns the device's peers have into want: the keys to
// remove, and the peers that are new or differ in endpoint or allowed IPs
// (in want's order).
func PeerChanges(have, want []Peer) (remove []wgtypes.Key, upsert []Peer) {
	byKey := map[wgtypes.Key]Peer{}
	for _, p := range have {
		byKey[p.PublicKey] = p
	}
	for _, p := range want {
		cur, ok := byKey[p.PublicKey]
		delete(byKey, p.PublicKey)
		curEP := netip.AddrPortFrom(cur.Endpoint.Addr().Unmap(), cur.Endpoint.Port())
		if !ok || curEP != p.Endpoint || !slices.Equal(sortedPrefixes(cur.AllowedIPs), sortedPrefixes(p.AllowedIPs)) {
			upsert = append(upsert, p)
		}
	}
	for _, p := range have {
		if _, gone := byKey[p.PublicKey]; gone {
			remove = append(remove, p.PublicKey)
		}
	}
	return remove, upsert
}

func sortedPrefixes(ps []netip.Prefix) []netip.Prefix {
	out := slices.Clone(ps)
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return out
}

// applyKernel runs in the node's namespace: the link's MTU, state and
// addresses, the rules, and Table.
func (r *Reconciler) applyKernel(d Desired) error {
	link, err := netlink.LinkByName(r.opts.Device)
	if err != nil {
		return err
	}
	var errs []error
	if link.Attrs().MTU != r.opts.MTU {
		if err := netlink.LinkSetMTU(link, r.opts.MTU); err != nil {
			errs = append(errs, fmt.Errorf("mtu of %s: %w", r.opts.Device, err))
		}
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(link); err != nil {
			errs = append(errs, fmt.Errorf("setting %s up: %w", r.opts.Device, err))
		}
	}
	errs = append(errs, nlutil.SyncAddrs(&netlink.Handle{}, link, d.Addrs)...)
	errs = append(errs, ensureRules())
	errs = append(errs, applyRoutes(link.Attrs().Index, d.Routes))
	return errors.Join(errs...)
}

// rule is the policy rule of a family that consults Table.
func rule(family int) *netlink.Rule {
	ru := netlink.NewRule()
	ru.Family, ru.Table, ru.Priority = family, Table, RulePriority
	return ru
}

func ensureRules() error {
	var errs []error
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		have, err := netlink.RuleList(fam)
		if errors.Is(err, unix.EAFNOSUPPORT) {
			continue // IPv6 disabled on the node
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if slices.ContainsFunc(have, func(ru netlink.Rule) bool { return ru.Table == Table && ru.Priority == RulePriority }) {
			continue
		}
		if err := netlink.RuleAdd(rule(fam)); err != nil {
			errs = append(errs, fmt.Errorf("rule %d lookup %d: %w", RulePriority, Table, err))
		}
	}
	return errors.Join(errs...)
}

// toRoute is r in netlink's terms.
func toRoute(r Route, link int) *netlink.Route {
	nr := &netlink.Route{Dst: nlutil.IPNet(r.Dst), Table: Table, Protocol: RouteProtocol, Family: family(r.Dst.Addr())}
	if r.Blackhole {
		nr.Type, nr.Priority = unix.RTN_BLACKHOLE, StrictMetric
		return nr
	}
	nr.LinkIndex, nr.Scope = link, netlink.SCOPE_LINK
	if r.Src.IsValid() {
		nr.Src = r.Src.AsSlice()
	}
	return nr
}

func family(a netip.Addr) int {
	if a.Is4() {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}

// routeKey identifies a route of Table: destination and whether it is a
// blackhole (the two live at different metrics).
type routeKey struct {
	dst       netip.Prefix
	blackhole bool
}

func applyRoutes(link int, want []Route) error {
	have, err := listRoutes()
	if err != nil {
		return err
	}
	wantBy := map[routeKey]Route{}
	for _, r := range want {
		wantBy[routeKey{r.Dst, r.Blackhole}] = r
	}
	var errs []error
	haveBy := map[routeKey]netlink.Route{}
	for _, nr := range have {
		k := routeKey{nlutil.RouteDst(nr), nr.Type == unix.RTN_BLACKHOLE}
		w, ok := wantBy[k]
		if _, dup := haveBy[k]; !ok || dup {
			if err := netlink.RouteDel(&nr); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("removing stale route %s table %d: %w", k.dst, Table, err))
			}
			continue
		}
		haveBy[k] = nr
		if !matches(nr, toRoute(w, link)) {
			delete(haveBy, k) // rewritten below
		}
	}
	for _, r := range want {
		if _, ok := haveBy[routeKey{r.Dst, r.Blackhole}]; ok {
			continue
		}
		if err := netlink.RouteReplace(toRoute(r, link)); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", r, err))
		}
	}
	return errors.Join(errs...)
}

func matches(have netlink.Route, want *netlink.Route) bool {
	return have.LinkIndex == want.LinkIndex && have.Priority == want.Priority && have.Scope == want.Scope &&
		net.IP(have.Src).Equal(want.Src)
}

// listRoutes lists weft's routes in Table, both families.
func listRoutes() ([]netlink.Route, error) {
	filter := &netlink.Route{Table: Table, Protocol: RouteProtocol}
	return nlutil.Dump("routes", func() ([]netlink.Route, error) {
		return netlink.RouteListFiltered(netlink.FAMILY_ALL, filter, netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
	})
}

// Close stops the process's side of the device and leaves the kernel
// state: an exiting agent keeps the tunnel's routes, so pod traffic waits
// for the next agent rather than leaving in clear.
func (r *Reconciler) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dev == nil {
		return nil
	}
	err := r.dev.close()
	r.dev = nil
	return err
}

// Cleanup removes what encryption installs: the rules, Table's routes and
// the device (DefaultDevice if device is empty). Nothing there is no error.
func Cleanup(device string, in Runner) error {
	if device == "" {
		device = DefaultDevice
	}
	return in.run(func() error {
		var errs []error
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			for {
				err := netlink.RuleDel(rule(fam))
				if err != nil {
					if !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EAFNOSUPPORT) {
						errs = append(errs, fmt.Errorf("removing rule %d lookup %d: %w", RulePriority, Table, err))
					}
					break
				}
			}
		}
		routes, err := listRoutes()
		errs = append(errs, err)
		for _, nr := range routes {
			if err := netlink.RouteDel(&nr); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, err)
			}
		}
		errs = append(errs, deleteLink(device))
		return errors.Join(errs...)
	})
}
