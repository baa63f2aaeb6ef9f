package ebpf

import (
	"testing"

	"github.com/cilium/ebpf"
)

// benchWriter is a writer on fresh, unpinned maps of the capacities the
// node's memory gives (those of a proxy without --bpf-lb-map-max).
func benchWriter(b *testing.B) *writer {
	caps := LBCapacities(LBMaxFor(memTotal()))
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
		ms.MaxEntries = uint32(caps[name])
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

// MapWriter is the backend's map writer on fresh, unpinned maps, for
// BenchmarkSync (an external test: it uses proxytest, which imports this
// package).
type MapWriter struct{ w *writer }

// NewMapWriter returns a MapWriter on maps closed when b ends.
func NewMapWriter(b *testing.B) MapWriter { return MapWriter{benchWriter(b)} }

// Apply is the writer's apply.
func (m MapWriter) Apply(want map[FrontendKey]Frontend, dirty map[FrontendKey]bool, full bool) error {
	return m.w.apply(want, dirty, full)
}

// Stats are the map writes of the last Apply.
func (m MapWriter) Stats() Stats { return m.w.Stats }
