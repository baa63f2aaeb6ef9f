// Command mkimage builds weft's container image as an OCI archive without a
// container engine (make image). Load it with e.g.
// `ctr -n k8s.io images import bin/weft-image.oci.tar` or
// `skopeo copy oci-archive:bin/weft-image.oci.tar docker://REGISTRY/weft:TAG`.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/weftnet/weft/internal/image"
)

func main() {
	var o image.Options
	flag.StringVar(&o.BinDir, "bin", "bin", "the repository's bin/ (make build)")
	flag.StringVar(&o.CacheDir, "cache", "bin/.debs", "where downloaded Debian packages are kept")
	flag.StringVar(&o.Out, "out", "bin/weft-image.oci.tar", "the OCI archive to write")
	flag.StringVar(&o.Name, "name", "ghcr.io/weftnet/weft:dev", "image reference recorded in the archive")
	flag.StringVar(&o.Version, "version", "dev", "weft version label")
	flag.Parse()
	if err := image.Build(context.Background(), o); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
	fmt.Println("wrote", o.Out)
}
