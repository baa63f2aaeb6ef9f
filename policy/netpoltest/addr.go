package netpoltest

import "net/netip"

// Addressed returns the bed with made-up pod addresses: the pods of
// namespace i on "node" i, at 10.244.i.(2+j) (the lab's address plan).
func Addressed() *World {
	w := NewWorld()
	for i, p := range w.Pods {
		SetIP(p, netip.AddrFrom4([4]byte{10, 244, byte(i / len(PodNames)), byte(2 + i%len(PodNames))}))
		p.Spec.NodeName = NodeName(i / len(PodNames))
	}
	return w
}

// NodeName names the i-th node of a made-up bed.
func NodeName(i int) string { return "node" + string(rune('1'+i)) }
