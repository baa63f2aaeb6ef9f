package oracle

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Case is one cell of a reachability grid.
type Case struct {
	From, To string // namespace/name
	Port     int32
	Proto    corev1.Protocol
}

// Matrix is a grid of allow (true) / deny answers over pods × pods for
// each port and protocol.
type Matrix struct {
	Pods   []string
	Ports  []int32
	Protos []corev1.Protocol
	Cells  map[Case]bool
}

// NewMatrix returns an empty grid.
func NewMatrix(pods []string, ports []int32, protos []corev1.Protocol) Matrix {
	return Matrix{Pods: pods, Ports: ports, Protos: protos, Cells: map[Case]bool{}}
}

// Cases lists every cell, in grid order.
func (m Matrix) Cases() []Case {
	var out []Case
	for _, proto := range m.Protos {
		for _, port := range m.Ports {
			for _, f := range m.Pods {
				for _, t := range m.Pods {
					out = append(out, Case{f, t, port, proto})
				}
			}
		}
	}
	return out
}

// Expect fills a grid from the oracle. pods must carry their addresses.
func Expect(w World, pods []*corev1.Pod, ports []int32, protos []corev1.Protocol) Matrix {
	byKey := map[string]*corev1.Pod{}
	var keys []string
	for _, p := range pods {
		k := p.Namespace + "/" + p.Name
		byKey[k] = p
		keys = append(keys, k)
	}
	m := NewMatrix(keys, ports, protos)
	for _, c := range m.Cases() {
		m.Cells[c] = w.Allowed(byKey[c.From], byKey[c.To], c.Proto, c.Port)
	}
	return m
}

// Diff lists the cells where got differs from m (a missing cell differs).
func (m Matrix) Diff(got Matrix) []Case {
	var out []Case
	for _, c := range m.Cases() {
		g, ok := got.Cells[c]
		if !ok || g != m.Cells[c] {
			out = append(out, c)
		}
	}
	return out
}

// SideBySide prints, for each port/protocol with a difference, the expected
// and the measured grid next to each other (rows: from, columns: to;
// . allowed, X denied, ! marks a wrong measured cell).
func SideBySide(want, got Matrix) string {
	var b strings.Builder
	diff := want.Diff(got)
	for _, proto := range want.Protos {
		for _, port := range want.Ports {
			if !slices.ContainsFunc(diff, func(c Case) bool { return c.Port == port && c.Proto == proto }) {
				continue
			}
			fmt.Fprintf(&b, "%s/%d: expected (left), measured (right)\n", proto, port)
			header := strings.Repeat(" ", maxLen(want.Pods)+1) + columns(want.Pods)
			fmt.Fprintf(&b, "%s   %s\n", header, columns(want.Pods))
			for _, f := range want.Pods {
				var l, r strings.Builder
				for _, t := range want.Pods {
					c := Case{f, t, port, proto}
					l.WriteString(mark(want.Cells[c]) + " ")
					g, ok := got.Cells[c]
					switch {
					case !ok:
						r.WriteString("? ")
					case g != want.Cells[c]:
						r.WriteString(mark(g) + "!")
					default:
						r.WriteString(mark(g) + " ")
					}
				}
				fmt.Fprintf(&b, "%-*s %s   %s\n", maxLen(want.Pods), f, l.String(), r.String())
			}
		}
	}
	return b.String()
}

func mark(allowed bool) string {
	if allowed {
		return "."
	}
	return "X"
}

// columns numbers the pods (the legend is the row names, in the same order).
func columns(pods []string) string {
	var b strings.Builder
	for i := range pods {
		fmt.Fprintf(&b, "%d ", i%10)
	}
	return b.String()
}

func maxLen(s []string) int {
	n := 0
	for _, x := range s {
		n = max(n, len(x))
	}
	return n
}
