// Command weft-cni is the weft CNI plugin, installed in the runtime's CNI
// bin dir as "weft". The container runtime executes it once per command.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/weftnet/weft/cni"
	"github.com/weftnet/weft/internal/buildinfo"
)

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{
		Add:    cni.Add,
		Del:    cni.Del,
		Check:  cni.Check,
		GC:     cni.GC,
		Status: cni.Status,
	}, version.PluginSupports("0.4.0", "1.0.0", "1.1.0"), "weft CNI plugin "+buildinfo.Version)
}
