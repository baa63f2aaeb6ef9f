// Package image assembles weft's container image without a container
// engine: a root filesystem holding the tools weft-agent executes (iptables,
// ip6tables, ipset, nft, conntrack and the libraries they link), unpacked
// from Debian's packages, and a layer with weft's static binaries, written
// as an OCI archive by internal/ociimage. The Dockerfile at the repository
// root builds the same content for users with a container engine.
//
// BuildTestImages (e2e.go) builds, the same way, the images the lab's pods
// run: stand-ins for those of the upstream e2e suite's [sig-network] specs
// and the lab's workload.
package image

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/weftnet/weft/internal/iptmode"
	"github.com/weftnet/weft/internal/ociimage"
)

// Packages are the Debian packages whose tools weft runs; their
// dependencies come along.
var Packages = []string{"iptables", "ipset", "nftables", "conntrack"}

// Binaries are the paths of weft's programs in the image, by the name of
// the file in the repository's bin/ they are copied from.
var Binaries = map[string]string{
	"weft-agent":      "usr/local/bin/weft-agent",
	"weft-dns":        "usr/local/bin/weft-dns",
	"weft-proxy":      "usr/local/bin/weft-proxy",
	"weftctl":         "usr/local/bin/weftctl",
	"cni/weft":        "opt/weft/cni/weft",
	"cni/weft-plugin": "opt/weft/cni/weft-plugin",
	"cni/portmap":     "opt/weft/cni/portmap",
}

// wrapper is where every iptables name of the image points until its
// first call picks the node's variant (internal/iptmode).
const wrapper = "/usr/local/bin/weftctl"

// Options say what to build.
type Options struct {
	BinDir   string // the repository's bin/ (make build)
	CacheDir string // downloaded .deb files, kept between builds
	Out      string // the OCI archive to write
	Name     string // image reference, e.g. ghcr.io/weftnet/weft:dev
	Version  string // weft's version, recorded as a label
}

// Build downloads the packages (Fetch) and writes the image to o.Out.
func Build(ctx context.Context, o Options) error {
	debs, err := Fetch(ctx, o.CacheDir, Packages)
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "weft-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	rootfs, weft := filepath.Join(work, "rootfs"), filepath.Join(work, "weft")
	versions, err := unpack(ctx, debs, rootfs)
	if err != nil {
		return err
	}
	// The iptables names weft calls point at the wrapper that picks the
	// node's variant.
	for _, name := range iptmode.Names {
		if err := os.Symlink(wrapper, filepath.Join(rootfs, iptmode.SbinDir, name)); err != nil {
			return fmt.Errorf("iptables link %s: %w", name, err)
		}
	}
	if err := mkdirs(rootfs, "var/run", "etc/weft"); err != nil {
		return err
	}
	for from, to := range Binaries {
		if err := copyFile(filepath.Join(o.BinDir, from), filepath.Join(weft, to), 0o755); err != nil {
			return fmt.Errorf("weft binary %s (run make build): %w", from, err)
		}
	}
	return ociimage.Write(o.Out, ociimage.Image{
		Name: o.Name,
		Env:  []string{"PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Labels: map[string]string{
			"org.opencontainers.image.source":  "https://github.com/weftnet/weft",
			"org.opencontainers.image.version": o.Version,
			"dev.weft.debian-packages":         strings.Join(versions, " "),
		},
		Layers: []string{rootfs, weft},
	})
}

// Fetch downloads packages and their dependencies (the versions apt
// resolves on this machine, Debian stable's) into cacheDir, unless they are
// there already, and returns the .deb files. apt's own resolver picks the
// dependencies, as if nothing were installed: Pre-Depends count, and one
// package of each alternative.
func Fetch(ctx context.Context, cacheDir string, packages []string) ([]string, error) {
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return nil, err
	}
	// Package lists older than the mirror name files it no longer has, and
	// a machine may have none yet: refresh them once and retry.
	for retried := false; ; retried = true {
		debs, missing, err := resolve(ctx, cacheDir, packages)
		if err == nil && len(missing) > 0 {
			err = aptDownload(ctx, cacheDir, missing)
		}
		if err == nil || retried {
			return debs, err
		}
		if out, uerr := exec.CommandContext(ctx, "apt-get", "update", "-qq").CombinedOutput(); uerr != nil {
			return nil, fmt.Errorf("%w (and apt-get update: %v: %s)", err, uerr, out)
		}
	}
}

// simulatedInstall matches what `apt-get install -s` would unpack:
// "Inst NAME (VERSION ORIGINS [ARCH])".
var simulatedInstall = regexp.MustCompile(`(?m)^Inst (\S+) \((\S+) [^\[]*\[([^\]]+)\]\)`)

// resolve lists the .deb files packages and their dependencies are in
// (cacheDir/NAME_VERSION_ARCH.deb, as apt-get download names them), and
// the NAME=VERSION of those not there yet.
func resolve(ctx context.Context, cacheDir string, packages []string) (debs, missing []string, err error) {
	args := append([]string{"install", "-s", "-qq", "--no-install-recommends", "-o", "Dir::State::status=/dev/null"}, packages...)
	out, err := exec.CommandContext(ctx, "apt-get", args...).CombinedOutput()
	if err != nil {
		return nil, nil, fmt.Errorf("resolving %s: apt-get install -s: %w: %s", strings.Join(packages, " "), err, out)
	}
	// By name, as dpkg-deb -x runs in this order (a later package's file
	// replaces an earlier one's).
	insts := simulatedInstall.FindAllStringSubmatch(string(out), -1)
	slices.SortFunc(insts, func(a, b []string) int { return strings.Compare(a[1], b[1]) })
	for _, m := range insts {
		name, version, arch := m[1], m[2], m[3]
		deb := filepath.Join(cacheDir, name+"_"+strings.ReplaceAll(version, ":", "%3a")+"_"+arch+".deb")
		debs = append(debs, deb)
		if _, err := os.Stat(deb); err != nil {
			missing = append(missing, name+"="+version)
		}
	}
	if len(debs) == 0 {
		return nil, nil, fmt.Errorf("resolving %s: apt-get install -s lists no package:\n%s", strings.Join(packages, " "), out)
	}
	return debs, missing, nil
}

func aptDownload(ctx context.Context, dir string, pkgs []string) error {
	cmd := exec.CommandContext(ctx, "apt-get", append([]string{"download", "-q"}, pkgs...)...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("apt-get download: %w: %s", err, stderr.String())
	}
	return nil
}

// unpack extracts the packages into rootfs, without their documentation,
// and returns their NAME_VERSION_ARCH. Maintainer scripts do not run: what
// they would set up, callers do.
func unpack(ctx context.Context, debs []string, rootfs string) ([]string, error) {
	var versions []string
	for _, d := range debs {
		if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", d, rootfs).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("unpacking %s: %v: %s", d, err, out)
		}
		versions = append(versions, strings.TrimSuffix(filepath.Base(d), ".deb"))
	}
	for _, d := range []string{"usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/lintian", "usr/share/locale"} {
		if err := os.RemoveAll(filepath.Join(rootfs, d)); err != nil {
			return nil, err
		}
	}
	return versions, nil
}

// mkdirs makes the directories a running container needs (/tmp, world
// writable and sticky, and the mount points /run, /sys, /proc, /dev), and
// dirs, where no package made them.
func mkdirs(rootfs string, dirs ...string) error {
	for _, d := range append([]string{"tmp", "run", "sys", "proc", "dev"}, dirs...) {
		p := filepath.Join(rootfs, d)
		if _, err := os.Lstat(p); err == nil {
			continue
		}
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
	}
	return os.Chmod(filepath.Join(rootfs, "tmp"), 0o1777)
}

func copyFile(from, to string, mode os.FileMode) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	return os.WriteFile(to, data, mode)
}
