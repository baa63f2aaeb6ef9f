// Package image assembles weft's container image without a container
// engine: a root filesystem holding the tools weft-agent executes (iptables,
// ip6tables, ipset, nft, conntrack and the libraries they link), unpacked
// from Debian's packages, and a layer with weft's static binaries, written
// as an OCI archive by internal/ociimage. The Dockerfile at the repository
// root builds the same content for users with a container engine.
package image

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
	debs, err := Fetch(ctx, o.CacheDir)
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "weft-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	rootfs, weft := filepath.Join(work, "rootfs"), filepath.Join(work, "weft")
	var versions []string
	for _, d := range debs {
		if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", d, rootfs).CombinedOutput(); err != nil {
			return fmt.Errorf("unpacking %s: %v: %s", d, err, out)
		}
		versions = append(versions, strings.TrimSuffix(filepath.Base(d), ".deb"))
	}
	if err := trim(rootfs); err != nil {
		return err
	}
	for from, to := range Binaries {
		if err := copyFile(filepath.Join(o.BinDir, from), filepath.Join(weft, to)); err != nil {
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

// Fetch downloads Packages and their dependencies (the versions apt
// resolves on this machine, Debian stable's) into cacheDir, and returns
// the .deb files.
func Fetch(ctx context.Context, cacheDir string) ([]string, error) {
	args := append([]string{"depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
		"--no-breaks", "--no-replaces", "--no-enhances", "--no-pre-depends"}, Packages...)
	out, err := exec.CommandContext(ctx, "apt-cache", args...).Output()
	if err != nil {
		return nil, fmt.Errorf("apt-cache depends %s: %w", strings.Join(Packages, " "), err)
	}
	var pkgs []string
	for _, line := range strings.Split(string(out), "\n") {
		// Top-level lines are packages; indented ones are relations,
		// and <name> is a virtual package some real one provides.
		if line != "" && !strings.HasPrefix(line, " ") && !strings.HasPrefix(line, "<") {
			pkgs = append(pkgs, line)
		}
	}
	slices.Sort(pkgs)
	pkgs = slices.Compact(pkgs)
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return nil, err
	}
	// Package lists older than the mirror name files it no longer has:
	// refresh them once and retry.
	if err := aptDownload(ctx, cacheDir, pkgs); err != nil {
		if out, uerr := exec.CommandContext(ctx, "apt-get", "update", "-qq").CombinedOutput(); uerr != nil {
			return nil, fmt.Errorf("%w (and apt-get update: %v: %s)", err, uerr, out)
		}
		if err := aptDownload(ctx, cacheDir, pkgs); err != nil {
			return nil, err
		}
	}
	var debs []string
	for _, p := range pkgs {
		m, _ := filepath.Glob(filepath.Join(cacheDir, p+"_*.deb"))
		if len(m) == 0 {
			return nil, fmt.Errorf("package %s: no .deb in %s after apt-get download", p, cacheDir)
		}
		slices.Sort(m)
		debs = append(debs, m[len(m)-1])
	}
	return debs, nil
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

// trim removes documentation and sets what the packages' maintainer
// scripts would have: the iptables names weft calls (pointing at the
// wrapper that picks the node's variant), and the directories a running
// container needs.
func trim(rootfs string) error {
	for _, d := range []string{"usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/lintian", "usr/share/locale"} {
		if err := os.RemoveAll(filepath.Join(rootfs, d)); err != nil {
			return err
		}
	}
	for _, name := range iptmode.Names {
		if err := os.Symlink(wrapper, filepath.Join(rootfs, iptmode.SbinDir, name)); err != nil {
			return fmt.Errorf("iptables link %s: %w", name, err)
		}
	}
	for _, d := range []string{"tmp", "run", "var/run", "etc/weft", "sys", "proc", "dev"} {
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

func copyFile(from, to string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	return os.WriteFile(to, data, 0o755)
}
