package image

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/weftnet/weft/internal/ociimage"
)

// The lab's containerd has no registry: every image a pod names is
// imported from an archive BuildTestImages writes. They stand in for the
// images the upstream e2e suite's [sig-network] specs run
// (k8s.io/kubernetes test/utils/image, v1.36.3) and hold the lab's
// workload.
//
// The e2e images whose containers run more than one program share one root
// filesystem, Debian's: agnhost and porter's TLS pair as in upstream's
// agnhost image (which is Alpine's), and the tools the specs run. An
// archive holds several names only where their configurations are equal,
// so they make four archives with the same layer; the others hold one
// static program each. agnhost's archive adds a layer with CoreDNS at
// /coredns, as upstream's agnhost image has it, when given one.

// TestOptions say what BuildTestImages builds from, and where to.
type TestOptions struct {
	Pause   string // a static pause (kubernetes build/pause)
	Agnhost string // agnhost (k8s.io/kubernetes/test/images/agnhost)
	// Iperf is iperf 2, 2.2.0 or later, linked against the libraries of
	// this machine's Debian (hack/build-iperf.sh): /usr/bin/iperf.
	Iperf string
	// CoreDNS is the coredns program (hack/build-coredns.sh), /coredns in
	// agnhost's image, which the spec "DNS should support configurable
	// pod resolv.conf" runs; without it agnhost's image has none.
	CoreDNS string
	// PorterCerts is the directory holding agnhost porter's TLS pair,
	// localhost.crt and localhost.key (test/images/agnhost/porter in the
	// k8s.io/kubernetes module).
	PorterCerts string
	Workload    string // the static weft-workload (make build)
	// Regression74839 is the static regression-issue-74839
	// (k8s.io/kubernetes/test/images/regression-issue-74839); without it
	// that image is not built.
	Regression74839 string
	CacheDir        string // downloaded .deb files, kept between builds
	OutDir          string // where the archives go
}

const e2eRegistry = "registry.k8s.io/e2e-test-images/"

// testPackages are the Debian packages of the shared root filesystem: the
// tools the specs call (sh, curl, wget, dig, nslookup, getent, nc with -u,
// ip, ss, ping, ps, awk, sed, grep, seq, timeout, dd, hostname, which;
// nsenter for the SCTP specs' host exec pods, as upstream's agnhost has
// it; conntrack for distroless-iptables' spec), and the C++ runtime of
// TestOptions.Iperf. Not busybox: its shell runs its own nc, which has no
// -u. Not Debian bookworm's iperf: its 2.1.8 prints a CSV the IPerf2 spec
// does not parse (hack/build-iperf.sh).
var testPackages = []string{
	"bash", "dash", "coreutils", "grep", "sed", "mawk", "debianutils", "hostname", "procps", "libc-bin", "util-linux",
	"curl", "wget", "bind9-dnsutils", "netcat-openbsd", "iproute2", "iputils-ping", "conntrack", "libstdc++6",
	// Settles procps' init-system-helpers' "usrmerge | usr-is-merged"
	// without usrmerge, which needs perl; no script checks it here.
	"usr-is-merged",
}

// links are what the packages' maintainer scripts would make
// (update-alternatives; dash's /bin/sh): dpkg-deb -x runs none. Each is
// made where missing.
var links = map[string]string{
	"bin/sh":        "dash",
	"bin/nc":        "nc.openbsd",
	"bin/netcat":    "nc.openbsd",
	"usr/bin/awk":   "mawk",
	"usr/bin/which": "which.debianutils",
}

// etcFiles are what base-passwd and base-files would install: the users
// root and nobody, and host names from /etc/hosts, then DNS.
var etcFiles = map[string]string{
	"etc/passwd":        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
	"etc/group":         "root:x:0:\nnobody:x:65534:\n",
	"etc/nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n",
}

// rootfsImages are the archives of the shared root filesystem, by file.
var rootfsImages = []struct {
	file    string
	img     ociimage.Image
	coreDNS bool // with TestOptions.CoreDNS at /coredns, in a layer of its own
}{
	// Upstream's entrypoint and command. 2.55 is the suite's AgnhostPrev
	// (apps specs; pre-pulled with --prepull-images) and 2.45 an older
	// tag: older versions of the same program.
	{"agnhost.oci.tar", ociimage.Image{
		Name:       e2eRegistry + "agnhost:2.63.0",
		Aliases:    []string{e2eRegistry + "agnhost:2.55", e2eRegistry + "agnhost:2.45"},
		Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"},
	}, true},
	// Debian with dig and getent, as upstream's glibc-dns-testing. The
	// specs that run these two set the command: the DNS specs' probes, and
	// distroless-iptables' spec (kube_proxy.go) sleep, then test, which,
	// conntrack and grep through sh.
	{"glibc-dns-testing.oci.tar", ociimage.Image{
		Name:    e2eRegistry + "glibc-dns-testing:2.0.0",
		Aliases: []string{"registry.k8s.io/build-image/distroless-iptables:v0.9.6"},
		Cmd:     []string{"/bin/sh"},
	}, false},
	// The specs run sh, sleep, echo and nc in it: GNU's and OpenBSD's do.
	{"busybox.oci.tar", ociimage.Image{Name: e2eRegistry + "busybox:1.37.0-1", Cmd: []string{"sh"}}, false},
	// The specs (endpoints, EndpointSlice) only need a running container;
	// this one serves HTTP on port 80, as nginx does.
	{"nginx.oci.tar", ociimage.Image{Name: e2eRegistry + "nginx:1.15-4", Entrypoint: []string{"/agnhost", "netexec", "--http-port=80"}}, false},
}

// BuildTestImages writes the test images' archives into o.OutDir:
// pause.oci.tar, weft-workload.oci.tar, regression-issue-74839.oci.tar
// (with o.Regression74839) and those of rootfsImages, from the packages
// Fetch downloads; agnhost.oci.tar has /coredns with o.CoreDNS.
func BuildTestImages(ctx context.Context, o TestOptions) error {
	if err := os.MkdirAll(o.OutDir, 0o755); err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "weft-test-images-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	if err := writeBinaryImages(o, work); err != nil {
		return err
	}
	rootfs := filepath.Join(work, "rootfs")
	versions, err := testRoot(ctx, o, rootfs)
	if err != nil {
		return err
	}
	coreDNS := filepath.Join(work, "coredns")
	if o.CoreDNS != "" {
		if err := copyFile(o.CoreDNS, filepath.Join(coreDNS, "coredns"), 0o755); err != nil {
			return fmt.Errorf("coredns: %w", err)
		}
	}
	for _, r := range rootfsImages {
		img := r.img
		img.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
		img.WorkingDir = "/"
		img.Labels = map[string]string{"dev.weft.debian-packages": strings.Join(versions, " ")}
		img.Layers = []string{rootfs}
		if r.coreDNS && o.CoreDNS != "" {
			img.Layers = append(img.Layers, coreDNS)
		}
		if err := ociimage.Write(filepath.Join(o.OutDir, r.file), img); err != nil {
			return err
		}
	}
	return nil
}

// WorkloadImage is the lab workload's image (weft-workload). Not tagged
// latest: the kubelet would pull that image on every start, and the lab
// has no registry.
const WorkloadImage = "docker.io/library/weft-workload:lab"

// writeBinaryImages writes the images made of one static program, /NAME,
// their entrypoint, each to NAME.oci.tar.
func writeBinaryImages(o TestOptions, work string) error {
	for _, b := range []struct {
		bin, name string
		optional  bool
		img       ociimage.Image
	}{
		// Upstream's runs as nobody.
		{o.Pause, "pause", false, ociimage.Image{Name: "registry.k8s.io/pause:3.10.2", User: "65535:65535"}},
		{o.Workload, "weft-workload", false, ociimage.Image{Name: WorkloadImage}},
		{o.Regression74839, "regression-issue-74839", true, ociimage.Image{Name: e2eRegistry + "regression-issue-74839:1.4"}},
	} {
		if b.bin == "" && b.optional {
			continue
		}
		dir := filepath.Join(work, b.name)
		if err := copyFile(b.bin, filepath.Join(dir, b.name), 0o755); err != nil {
			return fmt.Errorf("%s: %w", b.name, err)
		}
		img := b.img
		img.Entrypoint = []string{"/" + b.name}
		img.Layers = []string{dir}
		if err := ociimage.Write(filepath.Join(o.OutDir, b.name+".oci.tar"), img); err != nil {
			return err
		}
	}
	return nil
}

// testRoot assembles the shared root filesystem in rootfs and returns its
// packages' NAME_VERSION_ARCH.
func testRoot(ctx context.Context, o TestOptions, rootfs string) ([]string, error) {
	debs, err := Fetch(ctx, o.CacheDir, testPackages)
	if err != nil {
		return nil, err
	}
	versions, err := unpack(ctx, debs, rootfs)
	if err != nil {
		return nil, err
	}
	for link, target := range links {
		p := filepath.Join(rootfs, link)
		if _, err := os.Lstat(p); err == nil {
			continue
		}
		if err := os.Symlink(target, p); err != nil {
			return nil, err
		}
	}
	for name, content := range etcFiles {
		if err := os.WriteFile(filepath.Join(rootfs, name), []byte(content), 0o644); err != nil {
			return nil, err
		}
	}
	if err := copyFile(o.Agnhost, filepath.Join(rootfs, "agnhost"), 0o755); err != nil {
		return nil, fmt.Errorf("agnhost: %w", err)
	}
	if err := copyFile(o.Iperf, filepath.Join(rootfs, "usr/bin/iperf"), 0o755); err != nil {
		return nil, fmt.Errorf("iperf (hack/build-iperf.sh): %w", err)
	}
	for _, f := range []string{"localhost.crt", "localhost.key"} {
		if err := copyFile(filepath.Join(o.PorterCerts, f), filepath.Join(rootfs, f), 0o644); err != nil {
			return nil, fmt.Errorf("porter's TLS pair: %w", err)
		}
	}
	// netexec's /upload writes into /uploads.
	return versions, mkdirs(rootfs, "root", "uploads")
}
