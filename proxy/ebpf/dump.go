package ebpf

import (
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/cilium/ebpf"
)

// Dump prints the frontends and backends pinned under pinPath as a table:
// what the socket programs translate right now.
func Dump(pinPath string, out io.Writer) error {
	open := func(name string) (*ebpf.Map, error) {
		m, err := ebpf.LoadPinnedMap(filepath.Join(pinPath, name), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			return nil, fmt.Errorf("opening the pinned map %s: %w", name, err)
		}
		return m, nil
	}
	services, err := open("weft_services")
	if err != nil {
		return err
	}
	defer services.Close()
	backends, err := open("weft_backends")
	if err != nil {
		return err
	}
	defer backends.Close()
	w := newWriter(writerMaps{services: services, backends: backends})
	if err := w.load(); err != nil {
		return err
	}
	keys := make([]FrontendKey, 0, len(w.fronts))
	for k := range w.fronts {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, compareKeys)
	tw := tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "FRONTEND\tVERDICT\tAFFINITY\tBACKENDS")
	for _, k := range keys {
		f := w.fronts[k]
		verdict := "forward"
		switch {
		case f.flags&flagReject != 0:
			verdict = "reject"
		case f.flags&flagDrop != 0:
			verdict = "drop"
		case f.flags&flagSNAT != 0:
			verdict = "forward+snat"
		}
		if f.flags&flagRanges != 0 {
			verdict += "+ranges"
		}
		affinity := "-"
		if f.affinity > 0 {
			affinity = fmt.Sprintf("%ds", f.affinity)
		}
		var bes []string
		for _, id := range f.backends {
			if ap, ok := w.backendAddr[id]; ok {
				bes = append(bes, ap.String())
			} else {
				bes = append(bes, fmt.Sprintf("#%d(missing)", id))
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", k, verdict, affinity, strings.Join(bes, " "))
	}
	return tw.Flush()
}
