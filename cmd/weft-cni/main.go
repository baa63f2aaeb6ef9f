// Command weft-cni is the weft CNI plugin, installed in the runtime's CNI
// bin dir as "weft". The container runtime executes it once per command;
// DEL also executes it as `weft reap-veth`, the node's reaper, which
// finishes deleting veth pairs after DEL has returned (see cni.Reap).
package main

import (
	"fmt"
	"os"
	"runtime"

	"github.com/weftnet/weft/cni"
	"github.com/weftnet/weft/internal/buildinfo"
)

func main() {
	if len(os.Args) >= 2 && len(os.Args) <= 3 && os.Args[1] == cni.ReapArg {
		// A name is what DELs of earlier weft versions pass.
		name := ""
		if len(os.Args) == 3 {
			name = os.Args[2]
		}
		if err := cni.Reap(name); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	// One CNI command is sequential work in a process that lives for a few
	// milliseconds: a second P only makes the runtime start threads (each
	// a clone, stacks and page faults) to run its own background
	// goroutines. The reaper above keeps the default: it serves DELs
	// concurrently.
	runtime.GOMAXPROCS(1)
	cni.PluginMain(cni.Commands{
		Add:    cni.Add,
		Del:    cni.Del,
		Check:  cni.Check,
		GC:     cni.GC,
		Status: cni.Status,
	}, "weft CNI plugin "+buildinfo.Version)
}
