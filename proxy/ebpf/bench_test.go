package ebpf

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/proxy/model"
)

// benchState is n ClusterIP service ports with ten endpoints each, on
// other nodes.
func benchState(n int) model.State {
	st := model.State{Ports: map[model.ServicePortName]*model.ServicePort{}, Endpoints: map[model.ServicePortName][]model.Endpoint{}}
	for i := range n {
		name := model.ServicePortName{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i), Port: "http", Protocol: model.TCP}
		st.Ports[name] = &model.ServicePort{Name: name, Port: 80, Protocol: model.TCP,
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})}}
		for j := range 10 {
			k := i*10 + j
			st.Endpoints[name] = append(st.Endpoints[name], model.Endpoint{IP: netip.AddrFrom4([4]byte{10, 244, byte(k >> 8), byte(k)}),
				Port: 8080, Ready: true, NodeName: fmt.Sprintf("peer-%d", k%100)})
		}
	}
	return st
}

// benchWriter is a writer on fresh, unpinned maps.
func benchWriter(b *testing.B) *writer {
	spec, err := loadSock()
	if err != nil {
		b.Fatal(err)
	}
	np, err := loadNodeport()
	if err != nil {
		b.Fatal(err)
	}
	maps := map[string]*ebpf.Map{}
	for _, name := range []string{"weft_services", "weft_backends", "weft_affinity_members", "weft_src_ranges", "weft_maglev"} {
		ms, ok := spec.Maps[name]
		if !ok {
			ms = np.Maps[name]
		}
		ms = ms.Copy()
		ms.Pinning = ebpf.PinNone
		m, err := ebpf.NewMap(ms)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { m.Close() })
		maps[name] = m
	}
	return newWriter(writerMaps{services: maps["weft_services"], backends: maps["weft_backends"], members: maps["weft_affinity_members"],
		ranges: maps["weft_src_ranges"], maglev: maps["weft_maglev"]})
}

// BenchmarkSync: programming n services x 10 endpoints into empty maps,
// and one endpoint change (the incremental render plus the map writes).
func BenchmarkSync(b *testing.B) {
	if !netnsutil.Isolated() {
		b.Skip("needs root (BPF maps in a private namespace)")
	}
	cfg := Config{NodeName: "bench-node"}
	for _, n := range []int{1000, 10000} {
		st := benchState(n)
		b.Run(fmt.Sprintf("services=%d/from-scratch", n), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				w := benchWriter(b)
				b.StartTimer()
				if err := w.apply(Render(cfg, st), nil, true); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("services=%d/one-endpoint-change", n), func(b *testing.B) {
			w, r := benchWriter(b), NewRenderer(cfg)
			want, _ := r.Update(st)
			if err := w.apply(want, nil, true); err != nil {
				b.Fatal(err)
			}
			var name model.ServicePortName
			for name = range st.Ports {
				break
			}
			orig := st.Endpoints[name]
			changed := append([]model.Endpoint{}, orig...)
			changed[0].IP = netip.MustParseAddr("10.255.0.1")
			i := 0
			for b.Loop() {
				st.Endpoints[name] = orig
				if i%2 == 0 {
					st.Endpoints[name] = changed
				}
				i++
				want, dirty := r.Update(st)
				if err := w.apply(want, dirty, false); err != nil {
					b.Fatal(err)
				}
				if w.Stats.Frontends != 1 {
					b.Fatalf("one change wrote %+v", w.Stats)
				}
			}
			st.Endpoints[name] = orig
		})
	}
}
