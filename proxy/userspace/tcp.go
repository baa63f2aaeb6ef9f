package userspace

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"
)

// acceptLoop serves ln's connections until ln is closed.
func (l *listener) acceptLoop(ln *net.TCPListener) {
	for {
		c, err := ln.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: let some end.
			l.b.cfg.Log.Warn("accepting", "service", svcName(l.key), "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		go l.serveTCP(c)
	}
}

// serveTCP proxies one client connection: an endpoint is picked and
// dialled (the next one when it refuses or does not answer), then the
// bytes are copied both ways. A client that cannot be served (over the
// connection limit, no endpoint, none reachable) is reset.
func (l *listener) serveTCP(c *net.TCPConn) {
	b := l.b
	if !b.tcpLimit.acquire() {
		b.metrics.rejected("TCP", "limit")
		reset(c)
		return
	}
	defer b.tcpLimit.release()
	spec := l.spec.Load()
	client := addrPort(c.RemoteAddr())
	eps := l.endpointsFor(spec, addrPort(c.LocalAddr()).Addr(), client.Addr())
	if len(eps) == 0 {
		b.metrics.rejected("TCP", "no_endpoint")
		reset(c)
		return
	}
	var up *net.TCPConn
	for _, ep := range l.pick.order(client.Addr(), eps, spec.Affinity) {
		conn, err := net.DialTimeout("tcp", ep.String(), b.cfg.DialTimeout)
		if err != nil {
			b.metrics.endpointFailures.WithLabelValues("TCP").Inc()
			b.cfg.Log.Debug("endpoint failed, trying the next", "service", svcName(l.key), "endpoint", ep, "err", err)
			continue
		}
		up = conn.(*net.TCPConn)
		l.pick.chose(client.Addr(), ep, spec.Affinity)
		break
	}
	if up == nil {
		b.metrics.rejected("TCP", "unreachable")
		reset(c)
		return
	}
	p := proxied{client: c, up: up, port: l.key.Port, endpoint: unmap(addrPort(up.RemoteAddr()))}
	if !b.track(p) {
		reset(c)
		reset(up)
		return
	}
	defer b.untrack(p)
	b.metrics.connections.Inc()
	b.metrics.connectionsTotal.Inc()
	defer b.metrics.connections.Dec()
	pipe(c, up)
}

// pipe copies a and b into each other until both directions end. An
// orderly end of one direction (EOF) is passed on as a half-close; an
// error (a reset, a closed socket) ends both at once with a reset, as the
// peer saw it.
func pipe(a, b *net.TCPConn) {
	var wg sync.WaitGroup
	wg.Go(func() { half(b, a, a, b) })
	half(a, b, a, b)
	wg.Wait()
	_ = a.Close()
	_ = b.Close()
}

// half copies src into dst (splice(2) between TCP sockets).
func half(dst, src, a, b *net.TCPConn) {
	if _, err := io.Copy(dst, src); err != nil {
		reset(a)
		reset(b)
		return
	}
	_ = dst.CloseWrite()
}

// reset closes c with a reset rather than an orderly close.
func reset(c *net.TCPConn) {
	_ = c.SetLinger(0)
	_ = c.Close()
}

func unmap(a netip.AddrPort) netip.AddrPort { return netip.AddrPortFrom(a.Addr().Unmap(), a.Port()) }

func addrPort(a net.Addr) netip.AddrPort {
	switch v := a.(type) {
	case *net.TCPAddr:
		return v.AddrPort()
	case *net.UDPAddr:
		return v.AddrPort()
	}
	return netip.AddrPort{}
}
