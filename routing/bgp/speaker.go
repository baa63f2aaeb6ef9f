package bgp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"sync"
	"time"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"
)

// SpeakerOptions configure a Speaker.
type SpeakerOptions struct {
	// ListenPort for incoming sessions; 0 means 179, -1 no listener.
	ListenPort int32
	Log        *slog.Logger
}

// Speaker is the node's embedded gobgp server, driven by Plans. It exposes
// no gRPC listener.
type Speaker struct {
	opts    SpeakerOptions
	s       *server.BgpServer
	running bool
	asn     uint32
	id      netip.Addr
	rr      bool
	peers   map[netip.Addr]Neighbor
	paths   map[netip.Prefix]Announcement
	extSet  map[string]bool // the external-peer set of the export policy, nil before it exists
	changes chan struct{}

	mu    sync.Mutex
	state map[netip.Addr]peerState
	// What changed in the RIB since the last TakeChanges: the paths
	// peers sent or lost, in order, or relist when the whole RIB must be
	// read again (a new server, a session up or down, an End-of-RIB).
	pending []PathChange
	relist  bool
}

// PathChange is a path a peer sent (Path set) or lost (Path nil).
type PathChange struct {
	Prefix netip.Prefix
	Peer   netip.Addr
	Path   *Candidate
}

type peerState struct {
	established bool
	eor         map[bgp.Family]bool
}

var (
	familyV4 = bgp.NewFamily(bgp.AFI_IP, bgp.SAFI_UNICAST)
	familyV6 = bgp.NewFamily(bgp.AFI_IP6, bgp.SAFI_UNICAST)
)

// NewSpeaker returns a speaker; it starts with the first Apply.
func NewSpeaker(o SpeakerOptions) *Speaker {
	if o.ListenPort == 0 {
		o.ListenPort = 179
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return &Speaker{opts: o, changes: make(chan struct{}, 1), state: map[netip.Addr]peerState{}}
}

// Changes is poked (coalesced) when the RIB or a session changes;
// TakeChanges tells what changed. The speaker's owner must take them (the
// Controller does): until then the path changes accumulate.
func (sp *Speaker) Changes() <-chan struct{} { return sp.changes }

// TakeChanges returns the path changes since the last call, in order, or
// relist when the whole RIB must be read again (the listing then holds
// them all), and forgets them.
func (sp *Speaker) TakeChanges() (changes []PathChange, relist bool) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	changes, relist = sp.pending, sp.relist
	sp.pending, sp.relist = nil, false
	if relist {
		changes = nil
	}
	return changes, relist
}

// changed records paths sent or lost, or that the RIB must be listed
// again, and pokes.
func (sp *Speaker) changed(relist bool, paths []*apiutil.Path) {
	sp.mu.Lock()
	sp.relist = sp.relist || relist
	for _, p := range paths {
		if sp.relist {
			break // a listing to come holds it
		}
		prefix, ok := nlriPrefix(p.Nlri)
		if !ok {
			sp.relist = true
			break
		}
		ch := PathChange{Prefix: prefix.Masked(), Peer: p.PeerAddress.Unmap()}
		if !p.Withdrawal {
			c := candidate(prefix, p)
			ch.Path = &c
		}
		sp.pending = append(sp.pending, ch)
	}
	sp.mu.Unlock()
	sp.poke()
}

func (sp *Speaker) poke() {
	select {
	case sp.changes <- struct{}{}:
	default:
	}
}

// Apply makes the speaker's sessions and announcements those of p. A
// changed ASN, router ID or reflector role restarts the speaker. Peers
// that cannot be added are reported, the others go on.
func (sp *Speaker) Apply(ctx context.Context, p Plan) error {
	if sp.running && (sp.asn != p.ASN || sp.id != p.RouterID || sp.rr != p.Reflector) {
		sp.opts.Log.Info("restarting the BGP speaker", "asn", p.ASN, "routerID", p.RouterID, "reflector", p.Reflector)
		sp.Stop(ctx, false)
	}
	if !sp.running {
		if err := sp.start(ctx, p); err != nil {
			return err
		}
	}
	var errs []error
	want := map[netip.Addr]Neighbor{}
	for _, n := range p.Neighbors {
		want[n.Address] = n
	}
	for addr, cur := range sp.peers {
		// A changed neighbour (password, timers, role) is re-added.
		if n, ok := want[addr]; !ok || n != cur {
			if err := sp.s.DeletePeer(ctx, &api.DeletePeerRequest{Address: addr.String()}); err != nil {
				errs = append(errs, fmt.Errorf("removing peer %s (%s): %w", cur.Name, addr, err))
				continue
			}
			delete(sp.peers, addr)
			sp.mu.Lock()
			delete(sp.state, addr)
			sp.mu.Unlock()
		}
	}
	errs = append(errs, sp.syncExportPolicy(ctx, p.Neighbors))
	for addr, n := range want {
		if _, ok := sp.peers[addr]; ok {
			continue
		}
		if err := sp.s.AddPeer(ctx, &api.AddPeerRequest{Peer: peerConfig(n, p)}); err != nil {
			errs = append(errs, fmt.Errorf("adding peer %s (%s): %w", n.Name, addr, err))
			continue
		}
		sp.peers[addr] = n
	}
	errs = append(errs, sp.syncPaths(p.Announcements))
	return errors.Join(errs...)
}

func (sp *Speaker) start(ctx context.Context, p Plan) error {
	sp.s = server.NewBgpServer(server.LoggerOption(sp.opts.Log, nil))
	go sp.s.Serve()
	g := &api.Global{Asn: p.ASN, RouterId: p.RouterID.String(), ListenPort: sp.opts.ListenPort,
		GracefulRestart: &api.GracefulRestart{Enabled: true, RestartTime: p.RestartTime}}
	if err := sp.s.StartBgp(ctx, &api.StartBgpRequest{Global: g}); err != nil {
		sp.s.Stop()
		return fmt.Errorf("starting the BGP speaker (asn %d, router id %s): %w", p.ASN, p.RouterID, err)
	}
	// Every path a peer sends or loses (withdrawn, its session dropped,
	// a graceful-restart timer expired) is handed to the controller as a
	// change: it keeps its copy of the RIB with them and installs only
	// what they touch. These are the paths the RIB takes (gobgp leaves out
	// the looped ones before telling); sessions going up or down and
	// End-of-RIB relist everything (stale paths are swept then).
	if err := sp.s.WatchEvent(context.Background(), server.WatchEventMessageCallbacks{
		OnPathUpdate: func(paths []*apiutil.Path, _ time.Time) { sp.changed(false, paths) },
		OnPathEor: func(path *apiutil.Path, _ time.Time) {
			sp.mu.Lock()
			if st, ok := sp.state[path.PeerAddress.Unmap()]; ok {
				st.eor[path.Family] = true
			}
			sp.mu.Unlock()
			sp.changed(true, nil)
		},
		OnPeerUpdate: func(ev *apiutil.WatchEventMessage_PeerEvent, _ time.Time) {
			if ev.Type != apiutil.PEER_EVENT_STATE {
				return
			}
			addr := ev.Peer.State.NeighborAddress.Unmap()
			up := ev.Peer.State.SessionState == bgp.BGP_FSM_ESTABLISHED
			sp.mu.Lock()
			st := sp.state[addr]
			changed := up != st.established || st.eor == nil
			if changed {
				st = peerState{established: up, eor: map[bgp.Family]bool{}}
			}
			sp.state[addr] = st
			sp.mu.Unlock()
			sp.opts.Log.Info("BGP session", "peer", addr, "state", ev.Peer.State.SessionState.String())
			// Only a session going up or down matters to the routes: a
			// peer that cannot be reached cycles through the other states
			// at every retry.
			if changed {
				sp.changed(true, nil)
			}
		},
	}, server.WatchUpdate(false, "", ""), server.WatchAdjInWithdraw(), server.WatchEor(false), server.WatchPeer()); err != nil {
		sp.s.Stop()
		return fmt.Errorf("watching the BGP speaker: %w", err)
	}
	sp.running, sp.asn, sp.id, sp.rr = true, p.ASN, p.RouterID, p.Reflector
	sp.peers, sp.paths, sp.extSet = map[netip.Addr]Neighbor{}, map[netip.Prefix]Announcement{}, nil
	sp.changed(true, nil)
	return nil
}

// Stop ends the speaker. With graceful, no Cease goes to the peers, so
// they keep the node's routes for the restart time (an agent restart);
// without, they drop them at once.
func (sp *Speaker) Stop(ctx context.Context, graceful bool) {
	if !sp.running {
		return
	}
	// StopBgp ends the server's loop too; BgpServer.Stop would stop it a
	// second time (and log that it was not running), so it is only the
	// fallback.
	if err := sp.s.StopBgp(ctx, &api.StopBgpRequest{AllowGracefulRestart: graceful}); err != nil {
		sp.opts.Log.Warn("stopping the BGP speaker", "err", err)
		sp.s.Stop()
	}
	sp.running = false
	sp.mu.Lock()
	sp.state = map[netip.Addr]peerState{}
	sp.mu.Unlock()
}

// Converged reports whether every planned peer is established and has
// sent its End-of-RIB for every family negotiated with it: the RIB then
// holds everything the peers know, and routes missing from it are stale.
// With skipDown, peers whose session is not up do not count (they are
// unreachable, or refuse the session: waiting longer for them would only
// keep stale routes).
func (sp *Speaker) Converged(p Plan, skipDown bool) bool {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	for _, n := range p.Neighbors {
		st := sp.state[n.Address]
		if !st.established && skipDown {
			continue
		}
		if !st.established || (n.IPv4 && !st.eor[familyV4]) || (n.IPv6 && !st.eor[familyV6]) {
			return false
		}
	}
	return true
}

// Established lists the peers with an established session.
func (sp *Speaker) Established() []netip.Addr {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	var out []netip.Addr
	for a, st := range sp.state {
		if st.established {
			out = append(out, a)
		}
	}
	return out
}

func peerConfig(n Neighbor, p Plan) *api.Peer {
	pc := &api.Peer{
		Conf:            &api.PeerConf{NeighborAddress: n.Address.String(), PeerAsn: n.ASN, AuthPassword: n.Password, Description: n.Name},
		Transport:       &api.Transport{RemotePort: uint32(n.Port), PassiveMode: n.Passive},
		GracefulRestart: &api.GracefulRestart{Enabled: true, RestartTime: p.RestartTime},
		Timers:          &api.Timers{Config: &api.TimersConfig{HoldTime: uint64(n.HoldTime), KeepaliveInterval: uint64(n.Keepalive), ConnectRetry: 1}},
	}
	if n.Local.IsValid() {
		pc.Transport.LocalAddress = n.Local.String()
	}
	if n.MultihopTTL > 0 {
		pc.EbgpMultihop = &api.EbgpMultihop{Enabled: true, MultihopTtl: uint32(n.MultihopTTL)}
	}
	if n.RRClient {
		pc.RouteReflector = &api.RouteReflector{RouteReflectorClient: true, RouteReflectorClusterId: p.ClusterID.String()}
	}
	for _, f := range []struct {
		on  bool
		afi api.Family_Afi
	}{{n.IPv4, api.Family_AFI_IP}, {n.IPv6, api.Family_AFI_IP6}} {
		if f.on {
			pc.AfiSafis = append(pc.AfiSafis, &api.AfiSafi{
				Config:            &api.AfiSafiConfig{Family: &api.Family{Afi: f.afi, Safi: api.Family_SAFI_UNICAST}, Enabled: true},
				MpGracefulRestart: &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: true}},
			})
		}
	}
	return pc
}

// exportPolicy keeps routes learned from anyone away from external peers:
// they get only what this node originates (no iBGP route leaks, no transit
// between two routers through a node).
const (
	externalSet  = "weft-external-peers"
	exportPolicy = "weft-export"
)

func (sp *Speaker) syncExportPolicy(ctx context.Context, ns []Neighbor) error {
	want := map[string]bool{}
	for _, n := range ns {
		if n.External {
			want[netip.PrefixFrom(n.Address, n.Address.BitLen()).String()] = true
		}
	}
	if len(want) == 0 && sp.extSet == nil {
		return nil
	}
	// The set is edited in place (entries added, entries removed): gobgp's
	// policy holds the set it was built with, and a replaced set would be a
	// new one it never sees (a peer added later would get every route).
	var added, removed []string
	for p := range want {
		if !sp.extSet[p] {
			added = append(added, p)
		}
	}
	for p := range sp.extSet {
		if !want[p] {
			removed = append(removed, p)
		}
	}
	if len(added) > 0 {
		if err := sp.s.AddDefinedSet(ctx, &api.AddDefinedSetRequest{DefinedSet: &api.DefinedSet{
			DefinedType: api.DefinedType_DEFINED_TYPE_NEIGHBOR, Name: externalSet, List: added}}); err != nil {
			return fmt.Errorf("export policy: external peers set: %w", err)
		}
	}
	if len(removed) > 0 {
		if err := sp.s.DeleteDefinedSet(ctx, &api.DeleteDefinedSetRequest{DefinedSet: &api.DefinedSet{
			DefinedType: api.DefinedType_DEFINED_TYPE_NEIGHBOR, Name: externalSet, List: removed}}); err != nil {
			return fmt.Errorf("export policy: external peers set: %w", err)
		}
	}
	first := sp.extSet == nil
	sp.extSet = want
	if !first {
		return nil
	}
	var stmts []*api.Statement
	for i, rt := range []api.Conditions_RouteType{api.Conditions_ROUTE_TYPE_INTERNAL, api.Conditions_ROUTE_TYPE_EXTERNAL} {
		stmts = append(stmts, &api.Statement{Name: exportPolicy + "-" + strconv.Itoa(i),
			Conditions: &api.Conditions{NeighborSet: &api.MatchSet{Type: api.MatchSet_TYPE_ANY, Name: externalSet}, RouteType: rt},
			Actions:    &api.Actions{RouteAction: api.RouteAction_ROUTE_ACTION_REJECT}})
	}
	if err := sp.s.AddPolicy(ctx, &api.AddPolicyRequest{Policy: &api.Policy{Name: exportPolicy, Statements: stmts}}); err != nil {
		return fmt.Errorf("export policy: %w", err)
	}
	if err := sp.s.AddPolicyAssignment(ctx, &api.AddPolicyAssignmentRequest{Assignment: &api.PolicyAssignment{
		Name: "global", Direction: api.PolicyDirection_POLICY_DIRECTION_EXPORT,
		Policies: []*api.Policy{{Name: exportPolicy}}, DefaultAction: api.RouteAction_ROUTE_ACTION_ACCEPT}}); err != nil {
		return fmt.Errorf("export policy assignment: %w", err)
	}
	return nil
}

// syncPaths makes the originated paths exactly want.
func (sp *Speaker) syncPaths(want []Announcement) error {
	var errs []error
	keep := map[netip.Prefix]bool{}
	for _, a := range want {
		keep[a.Prefix] = true
		if cur, ok := sp.paths[a.Prefix]; ok && cur.NextHop == a.NextHop && fmt.Sprint(cur.Communities) == fmt.Sprint(a.Communities) {
			continue
		}
		path, err := toPath(a)
		if err == nil {
			var rs []apiutil.AddPathResponse
			rs, err = sp.s.AddPath(apiutil.AddPathRequest{Paths: []*apiutil.Path{path}})
			if err == nil && len(rs) == 1 {
				err = rs[0].Error
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("announcing %s %s: %w", a.Kind, a.Prefix, err))
			continue
		}
		sp.paths[a.Prefix] = a
	}
	for prefix, a := range sp.paths {
		if keep[prefix] {
			continue
		}
		path, err := toPath(a)
		if err == nil {
			err = sp.s.DeletePath(apiutil.DeletePathRequest{Paths: []*apiutil.Path{path}})
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("withdrawing %s %s: %w", a.Kind, a.Prefix, err))
			continue
		}
		delete(sp.paths, prefix)
	}
	return errors.Join(errs...)
}

func toPath(a Announcement) (*apiutil.Path, error) {
	nlri, err := bgp.NewIPAddrPrefix(a.Prefix)
	if err != nil {
		return nil, err
	}
	attrs := []bgp.PathAttributeInterface{bgp.NewPathAttributeOrigin(bgp.BGP_ORIGIN_ATTR_TYPE_IGP)}
	fam := familyV4
	if a.Prefix.Addr().Is4() {
		nh, err := bgp.NewPathAttributeNextHop(a.NextHop)
		if err != nil {
			return nil, err
		}
		attrs = append(attrs, nh)
	} else {
		fam = familyV6
		mp, err := bgp.NewPathAttributeMpReachNLRI(fam, []bgp.PathNLRI{{NLRI: nlri}}, a.NextHop)
		if err != nil {
			return nil, err
		}
		attrs = append(attrs, mp)
	}
	if len(a.Communities) > 0 {
		attrs = append(attrs, bgp.NewPathAttributeCommunities(a.Communities))
	}
	return &apiutil.Path{Family: fam, Nlri: nlri, Attrs: attrs}, nil
}

// Candidates lists every path of the global RIB, both families.
func (sp *Speaker) Candidates() ([]Candidate, error) {
	if !sp.running {
		return nil, nil
	}
	var out []Candidate
	for _, fam := range []bgp.Family{familyV4, familyV6} {
		err := sp.s.ListPath(apiutil.ListPathRequest{TableType: api.TableType_TABLE_TYPE_GLOBAL, Family: fam},
			func(nlri bgp.NLRI, paths []*apiutil.Path) {
				prefix, ok := nlriPrefix(nlri)
				if !ok {
					return
				}
				for _, p := range paths {
					out = append(out, candidate(prefix, p))
				}
			})
		if err != nil {
			return nil, fmt.Errorf("listing the RIB: %w", err)
		}
	}
	return out, nil
}

// nlriPrefix is the prefix of a unicast NLRI (both families are
// IPAddrPrefix: no formatting and parsing on the path of every update).
func nlriPrefix(n bgp.NLRI) (netip.Prefix, bool) {
	if p, ok := n.(*bgp.IPAddrPrefix); ok {
		return p.Prefix, p.Prefix.IsValid()
	}
	p, err := netip.ParsePrefix(n.String())
	return p, err == nil
}

func candidate(prefix netip.Prefix, p *apiutil.Path) Candidate {
	c := Candidate{Prefix: prefix, LocalPref: 100, Local: !p.PeerAddress.IsValid() || p.PeerAddress.IsUnspecified(), Peer: p.PeerAddress.Unmap()}
	for _, a := range p.Attrs {
		switch a := a.(type) {
		case *bgp.PathAttributeNextHop:
			c.NextHop = a.Value.Unmap()
		case *bgp.PathAttributeMpReachNLRI:
			c.NextHop = a.Nexthop.Unmap()
		case *bgp.PathAttributeLocalPref:
			c.LocalPref = a.Value
		case *bgp.PathAttributeOrigin:
			c.Origin = a.Value
		case *bgp.PathAttributeMultiExitDisc:
			c.MED = a.Value
		case *bgp.PathAttributeCommunities:
			c.Communities = a.Value
		case *bgp.PathAttributeAsPath:
			for _, seg := range a.Value {
				c.ASPathLen += seg.ASLen()
			}
		}
	}
	return c
}
