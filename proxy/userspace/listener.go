package userspace

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/weftnet/weft/proxy/model"
)

// listener is one listening port of the proxy (a socket per address of
// Backend.addrs) and the sessions and picker of its service port.
type listener struct {
	b     *Backend
	key   Key
	proto model.Protocol
	port  uint16
	own   bool // port is the Service's own port (rootless)
	spec  atomic.Pointer[Listener]
	pick  picker

	tcp []*net.TCPListener
	udp []*udpSocket

	smu      sync.Mutex
	sessions map[sessionKey]*session
	closed   bool
	wg       sync.WaitGroup
}

// bind opens a listener for spec on the first of its candidate ports that
// every address of the backend can take.
func (b *Backend) bind(spec Listener) (*listener, error) {
	what := describe(spec.Key, spec.ServicePort)
	if spec.Protocol == model.SCTP {
		return nil, fmt.Errorf("%s: %w", what, errSCTP)
	}
	cands := Candidates(spec.Key, spec.ServicePort, b.Rootless(), b.cfg.PortRange)
	var last error
	for _, port := range cands {
		l, err := b.listenOn(spec, port)
		if err == nil {
			return l, nil
		}
		last = err
		if errors.Is(err, syscall.EADDRNOTAVAIL) {
			break // the address is not the node's: no port will do
		}
	}
	tried := fmt.Sprintf("%d ports of %s", len(cands), b.cfg.PortRange)
	if b.Rootless() {
		tried = fmt.Sprintf("its own port and %d ports of %s", len(cands)-1, b.cfg.PortRange)
	}
	return nil, fmt.Errorf("%s: no port to listen on (tried %s): %w", what, tried, last)
}

// listenOn opens spec's sockets on port, on every address, or none.
func (b *Backend) listenOn(spec Listener, port uint16) (*listener, error) {
	l := &listener{b: b, key: spec.Key, proto: spec.Protocol, port: port, own: b.Rootless() && port == spec.ServicePort,
		sessions: map[sessionKey]*session{}}
	l.pick.now = b.now
	l.spec.Store(&spec)
	l.pick.setAffinity(spec.Affinity)
	for _, a := range b.addrs {
		network := "4"
		if a.Is6() {
			network = "6"
		}
		switch spec.Protocol {
		case model.TCP:
			ln, err := net.ListenTCP("tcp"+network, net.TCPAddrFromAddrPort(netip.AddrPortFrom(a, port)))
			if err != nil {
				l.closeSockets()
				return nil, err
			}
			l.tcp = append(l.tcp, ln)
		case model.UDP:
			c, err := net.ListenUDP("udp"+network, net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, port)))
			if err != nil {
				l.closeSockets()
				return nil, err
			}
			s, err := newUDPSocket(c, a.Is6())
			if err != nil {
				_ = c.Close()
				l.closeSockets()
				return nil, err
			}
			l.udp = append(l.udp, s)
		}
	}
	for _, ln := range l.tcp {
		l.wg.Go(func() { l.acceptLoop(ln) })
	}
	for _, s := range l.udp {
		l.wg.Go(func() { l.readLoop(s) })
	}
	return l, nil
}

// address is where the listener listens (its first address).
func (l *listener) address() string {
	return net.JoinHostPort(l.b.addrs[0].String(), strconv.Itoa(int(l.port)))
}

// update hands the listener a new spec: new connections and sessions get
// the new endpoints at once; established TCP connections are left alone,
// UDP sessions whose endpoint is no longer listed end (their next datagram
// starts a new session).
func (l *listener) update(spec Listener) {
	l.spec.Store(&spec)
	l.pick.setAffinity(spec.Affinity)
	if l.proto != model.UDP {
		return
	}
	listed := func(ep netip.AddrPort) bool {
		for _, e := range spec.ByFamily {
			if slices.Contains(e.Serve, ep) || slices.Contains(e.Cluster, ep) {
				return true
			}
		}
		return false
	}
	for _, s := range l.sessionList() {
		if !listed(s.endpoint()) {
			s.close()
		}
	}
}

// endpointsFor are the endpoints a client gets: those of the family it
// connected over (rootless: the Service's), the cluster-wide list for pods
// and the node on an externalTrafficPolicy Local frontend.
func (l *listener) endpointsFor(spec *Listener, local, client netip.Addr) []netip.AddrPort {
	f := familyIndex(local)
	if spec.Family != 0 {
		f = 0
		if spec.Family == 6 {
			f = 1
		}
	}
	e := spec.ByFamily[f]
	if e.Cluster != nil && l.b.internalClient(client) {
		return e.Cluster
	}
	return e.Serve
}

// close stops listening and ends the UDP sessions; proxied TCP connections
// go on until they end (as conntrack keeps them for the kernel backends).
func (l *listener) close() {
	l.smu.Lock()
	l.closed = true
	l.smu.Unlock()
	l.closeSockets()
	for _, s := range l.sessionList() {
		s.close()
	}
	l.wg.Wait()
}

func (l *listener) closeSockets() {
	for _, ln := range l.tcp {
		_ = ln.Close()
	}
	for _, s := range l.udp {
		_ = s.conn.Close()
	}
}

func (l *listener) sessionList() []*session {
	l.smu.Lock()
	defer l.smu.Unlock()
	out := make([]*session, 0, len(l.sessions))
	for _, s := range l.sessions {
		out = append(out, s)
	}
	return out
}
