package iptables

import (
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	"github.com/weftnet/weft/policy/tierbox"
)

// lookup judges addr the way the kernel's hash:net types do: the most
// specific entry holding it decides, nomatch meaning not in the set.
func lookup(entries []string, addr netip.Addr) bool {
	best, in := -1, false
	for _, e := range entries {
		p, nomatch := strings.CutSuffix(e, " nomatch")
		pfx := netip.MustParsePrefix(p)
		if pfx.Contains(addr) && pfx.Bits() > best {
			best, in = pfx.Bits(), !nomatch
		}
	}
	return in
}

// setEntries must be exact for any union of nets-minus-exceptions and pod
// addresses, exceptions of one block never hiding another block's nets.
func TestSetEntriesExact(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	randPrefix := func() netip.Prefix {
		bits := 22 + r.IntN(11)
		if r.IntN(10) == 0 {
			bits = r.IntN(3) * 8 // /0, /8, /16 now and then
		}
		a := netip.AddrFrom4([4]byte{10, 0, byte(r.IntN(4)), byte(r.IntN(256))})
		return netip.PrefixFrom(a, bits).Masked()
	}
	for round := range 300 {
		var blocks []tierbox.Block
		for range 1 + r.IntN(4) {
			var b tierbox.Block
			for range 1 + r.IntN(3) {
				b.Nets = append(b.Nets, randPrefix())
			}
			for range r.IntN(4) {
				e := randPrefix()
				if e.Bits() > b.Nets[0].Bits() {
					b.Except = append(b.Except, e)
				}
			}
			blocks = append(blocks, b)
		}
		entries := setEntries(blocks)
		for i := range 1024 + 2 {
			addr := netip.AddrFrom4([4]byte{10, 0, byte(i / 256), byte(i)})
			if i >= 1024 {
				addr = netip.AddrFrom4([4]byte{byte(100 + 100*(i-1024)), 1, 2, 3})
			}
			want := false
			for _, b := range blocks {
				in, out := false, false
				for _, n := range b.Nets {
					in = in || n.Contains(addr)
				}
				for _, e := range b.Except {
					out = out || e.Contains(addr)
				}
				want = want || (in && !out)
			}
			if got := lookup(entries, addr); got != want {
				t.Fatalf("round %d: %s in set %v, want %v\nblocks %+v\nentries %q", round, addr, got, want, blocks, entries)
			}
		}
	}
}
