// Command mkimage builds weft's container image as an OCI archive without a
// container engine (make image). Load it with e.g.
// `ctr -n k8s.io images import bin/weft-image.oci.tar` or
// `skopeo copy oci-archive:bin/weft-image.oci.tar docker://REGISTRY/weft:TAG`.
//
// With -test-images DIR it builds instead the lab's test images into DIR
// (internal/image.BuildTestImages), one archive each, from the programs
// -pause, -agnhost, -iperf, -workload, -regression-74839 and -coredns and
// the TLS pair in -porter-certs.
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
	var t image.TestOptions
	flag.StringVar(&o.BinDir, "bin", "bin", "the repository's bin/ (make build)")
	flag.StringVar(&o.CacheDir, "cache", "bin/.debs", "where downloaded Debian packages are kept")
	flag.StringVar(&o.Out, "out", "bin/weft-image.oci.tar", "the OCI archive to write")
	flag.StringVar(&o.Name, "name", "ghcr.io/weftnet/weft:dev", "image reference recorded in the archive")
	flag.StringVar(&o.Version, "version", "dev", "weft version label")
	flag.StringVar(&t.OutDir, "test-images", "", "build the lab's test images into this directory instead of weft's image")
	flag.StringVar(&t.Pause, "pause", "", "with -test-images: a static pause binary")
	flag.StringVar(&t.Agnhost, "agnhost", "", "with -test-images: the agnhost binary (k8s.io/kubernetes/test/images/agnhost)")
	flag.StringVar(&t.Iperf, "iperf", "", "with -test-images: iperf 2.2 or later, built against this machine's Debian (hack/build-iperf.sh)")
	flag.StringVar(&t.CoreDNS, "coredns", "", "with -test-images: the coredns binary, /coredns in agnhost's image (optional: without it agnhost has none)")
	flag.StringVar(&t.PorterCerts, "porter-certs", "", "with -test-images: the directory with localhost.crt and localhost.key (test/images/agnhost/porter of k8s.io/kubernetes)")
	flag.StringVar(&t.Workload, "workload", "", "with -test-images: the static weft-workload binary")
	flag.StringVar(&t.Regression74839, "regression-74839", "", "with -test-images: the static regression-issue-74839 binary (optional)")
	flag.Parse()
	ctx, wrote := context.Background(), o.Out
	var err error
	if t.OutDir != "" {
		t.CacheDir, wrote = o.CacheDir, t.OutDir
		err = image.BuildTestImages(ctx, t)
	} else {
		err = image.Build(ctx, o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
	fmt.Println("wrote", wrote)
}
