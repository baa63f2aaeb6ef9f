// Command weft-cni is the weft CNI plugin's Go binary, installed in the
// runtime's CNI bin dir as "weft-plugin" next to "weft", the small static
// program the runtime executes (shim/weft.c), which hands each command to
// `weft-plugin serve-cni`, the node's resident command server, or executes
// weft-plugin when none serves (see cni/server.go). Run directly, it serves
// one command, as any CNI plugin. DEL also executes it as
// `weft-plugin reap-veth`, the node's reaper, which finishes deleting veth
// pairs after DEL has returned (see cni.Reap).
package main

import (
	"fmt"
	"os"
	"runtime"

	"github.com/weftnet/weft/cni"
	"github.com/weftnet/weft/internal/buildinfo"
)

func main() {
	cmds := cni.Commands{
		Add:    cni.Add,
		Del:    cni.Del,
		Check:  cni.Check,
		GC:     cni.GC,
		Status: cni.Status,
	}
	about := "weft CNI plugin " + buildinfo.Version
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
	if len(os.Args) == 2 && os.Args[1] == cni.ServeArg {
		if err := cni.Serve(cmds, about); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	// One CNI command is sequential work in a process that lives for a few
	// milliseconds: a second P only makes the runtime start threads (each
	// a clone, stacks and page faults) to run its own background
	// goroutines. The reaper and the server above keep the default: they
	// serve commands concurrently.
	runtime.GOMAXPROCS(1)
	status := cni.PluginMain(cmds, about)
	if os.Getenv(cni.ServeEnv) != "" {
		// The shim found no current server: start one for the next
		// commands. Its failure is not this command's.
		_ = cni.StartServer()
	}
	os.Exit(status)
}
