package netpoltest

import (
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weftnet/weft/internal/image"
)

// The bed's names, ports and protocols. The kernel bed (NewBed) adds SCTP
// to Protocols on a kernel that has SCTP; the lab's workloads serve TCP and
// UDP only.
var (
	NamespaceNames = []string{"x", "y", "z"}
	PodNames       = []string{"a", "b", "c"}
	Ports          = []int32{80, 81}
	Protocols      = []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP}
)

// NSLabel and PodLabel are the labels every namespace and pod carries
// (value: its name), as in the upstream suite.
const (
	NSLabel  = "ns"
	PodLabel = "pod"
)

// PortName is the name of a pod's container port: serve-80-tcp,
// serve-80-udp, serve-80-sctp, ...
func PortName(port int32, proto corev1.Protocol) string {
	return fmt.Sprintf("serve-%d-%s", port, strings.ToLower(string(proto)))
}

// WorkloadArgs are the lab workload's arguments: TCP and UDP echo on every
// port of the bed, no HTTP.
func WorkloadArgs() []string {
	return []string{"--http=", "--tcp-echo=:80,:81", "--udp-echo=:80,:81"}
}

// World is the bed's objects. Pod addresses are filled in by whoever runs
// the pods (SetIP).
type World struct {
	Namespaces []*corev1.Namespace
	Pods       []*corev1.Pod
}

// NewWorld returns the namespaces and pods of the bed, without addresses.
func NewWorld() *World {
	w := &World{}
	for _, ns := range NamespaceNames {
		w.Namespaces = append(w.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{NSLabel: ns}}})
		for _, name := range PodNames {
			var ports []corev1.ContainerPort
			for _, proto := range Protocols {
				for _, port := range Ports {
					ports = append(ports, corev1.ContainerPort{Name: PortName(port, proto), ContainerPort: port, Protocol: proto})
				}
			}
			w.Pods = append(w.Pods, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{PodLabel: name}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "w", Image: image.WorkloadImage, Args: WorkloadArgs(), Ports: ports}}},
			})
		}
	}
	return w
}

// Pod returns the pod ns/name.
func (w *World) Pod(ns, name string) *corev1.Pod {
	for _, p := range w.Pods {
		if p.Namespace == ns && p.Name == name {
			return p
		}
	}
	panic("netpoltest: no pod " + ns + "/" + name)
}

// Namespace returns the namespace name.
func (w *World) Namespace(name string) *corev1.Namespace {
	for _, n := range w.Namespaces {
		if n.Name == name {
			return n
		}
	}
	panic("netpoltest: no namespace " + name)
}

// SetIP records a pod's address.
func SetIP(p *corev1.Pod, ip netip.Addr) {
	p.Status.PodIP = ip.String()
	p.Status.PodIPs = []corev1.PodIP{{IP: ip.String()}}
	p.Status.Phase = corev1.PodRunning
}

// IP returns a pod's address (the zero Addr when it has none).
func IP(p *corev1.Pod) netip.Addr {
	a, _ := netip.ParseAddr(p.Status.PodIP)
	return a
}
