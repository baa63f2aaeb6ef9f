package main

import (
	"flag"
	"fmt"
	"strings"

	"github.com/weftnet/weft/internal/cniinstall"
)

// installCNI is the weft-agent DaemonSet's init container: it puts the
// image's CNI plugins into the node's CNI bin directory.
func installCNI(args []string) error {
	fs := flag.NewFlagSet("install-cni", flag.ContinueOnError)
	from := fs.String("from", "/opt/weft/cni", "directory of the plugins to install")
	to := fs.String("to", "/host/opt/cni/bin", "the node's CNI bin directory, mounted into the container")
	replace := fs.String("replace", "weft-plugin,weft", "comma-separated plugins always replaced; the others are installed only where the node lacks them")
	if err := fs.Parse(args); err != nil {
		return err
	}
	done, err := cniinstall.Install(*from, *to, strings.Split(*replace, ","))
	if err != nil {
		return err
	}
	fmt.Printf("installed into %s: %s\n", *to, strings.Join(done, " "))
	return nil
}
