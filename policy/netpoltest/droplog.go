package netpoltest

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/internal/nflog"
	"github.com/weftnet/weft/policy"
)

// CheckDropLogged sends a TCP connection attempt from the bed's pod from
// to to's port 80, which the rules in force must drop at to's ingress,
// and checks that nflog group receives it with the drop log's prefix
// and the attempt's flow.
func (b *Bed) CheckDropLogged(t testing.TB, group uint16, from, to string) {
	t.Helper()
	r, err := nflog.Open(group)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got := make(chan []nflog.Packet, 1)
	go func() {
		ps, _ := r.Read()
		got <- ps
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if c, err := netnsutil.Dialer(b.Targets[from].NSPath, nil)(ctx, "tcp", net.JoinHostPort(b.Targets[to].IP, "80")); err == nil {
		c.Close()
		t.Fatalf("%s reached %s:80, which the rules deny", from, to)
	}
	want := nflog.Flow{Src: netip.MustParseAddr(b.Targets[from].IP), Dst: netip.MustParseAddr(b.Targets[to].IP), Protocol: unix.IPPROTO_TCP, Port: 80}
	select {
	case ps := <-got:
		if len(ps) == 0 {
			t.Fatal("the drop log reader failed")
		}
		f, ok := nflog.ParseFlow(ps[0].Payload)
		if ps[0].Prefix != policy.DropLogPrefix+"ingress" || !ok || f != want {
			t.Fatalf("logged %q %+v, want %q %+v", ps[0].Prefix, f, policy.DropLogPrefix+"ingress", want)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("the drop of %s -> %s:80 was not logged to nflog group %d", from, to, group)
	}
}
