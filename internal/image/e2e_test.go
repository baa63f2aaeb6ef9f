package image

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/internal/ociimage"
	"github.com/weftnet/weft/internal/testutil"
)

// standIns writes stand-ins for the test images' programs (copies of
// /bin/true, each with its name appended, so that they run and differ) and
// porter's TLS pair, and returns options naming them.
func standIns(t *testing.T) TestOptions {
	t.Helper()
	dir := t.TempDir()
	prog, err := os.ReadFile("/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	o := TestOptions{
		Pause: filepath.Join(dir, "pause"), Agnhost: filepath.Join(dir, "agnhost"),
		Iperf: filepath.Join(dir, "iperf"), CoreDNS: filepath.Join(dir, "coredns"),
		Workload: filepath.Join(dir, "weft-workload"), Regression74839: filepath.Join(dir, "regression"),
		PorterCerts: dir, OutDir: t.TempDir(),
	}
	for _, p := range []string{o.Pause, o.Agnhost, o.Iperf, o.CoreDNS, o.Workload, o.Regression74839} {
		if err := os.WriteFile(p, append(slices.Clip(prog), filepath.Base(p)...), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"localhost.crt", "localhost.key"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("stand-in "+f), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return o
}

// wantImage is what one archive must hold.
type wantImage struct {
	file            string
	names           []string
	entrypoint, cmd []string
	user            string
}

var wantBinaryImages = []wantImage{
	{file: "pause.oci.tar", names: []string{"registry.k8s.io/pause:3.10.2"}, entrypoint: []string{"/pause"}, user: "65535:65535"},
	{file: "weft-workload.oci.tar", names: []string{WorkloadImage}, entrypoint: []string{"/weft-workload"}},
	{file: "regression-issue-74839.oci.tar", names: []string{"registry.k8s.io/e2e-test-images/regression-issue-74839:1.4"}, entrypoint: []string{"/regression-issue-74839"}},
}

// checkImage unpacks the archive w names in dir and checks its names and
// configuration; it returns the root filesystem and the configuration.
func checkImage(t *testing.T, dir string, w wantImage) (string, ociimage.Config) {
	t.Helper()
	archive := filepath.Join(dir, w.file)
	names, err := ociimage.Names(archive)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(names, w.names) {
		t.Errorf("%s holds the names %q, want %q", w.file, names, w.names)
	}
	root := t.TempDir()
	_, cfg, err := ociimage.Unpack(archive, root)
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.Config
	if !slices.Equal(c.Entrypoint, w.entrypoint) || !slices.Equal(c.Cmd, w.cmd) || c.User != w.user {
		t.Errorf("%s: entrypoint %q, command %q, user %q; want %q, %q, %q", w.file, c.Entrypoint, c.Cmd, c.User, w.entrypoint, w.cmd, w.user)
	}
	return root, cfg
}

func sameFile(t *testing.T, got, want string) {
	t.Helper()
	g, err := os.ReadFile(got)
	if err != nil {
		t.Fatal(err)
	}
	w, err := os.ReadFile(want)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(g, w) {
		t.Errorf("%s is not %s", got, want)
	}
}

func TestBinaryImages(t *testing.T) {
	o := standIns(t)
	if err := writeBinaryImages(o, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	for i, w := range wantBinaryImages {
		root, _ := checkImage(t, o.OutDir, w)
		sameFile(t, filepath.Join(root, w.entrypoint[0]), []string{o.Pause, o.Workload, o.Regression74839}[i])
	}

	// regression-issue-74839 is optional.
	o.Regression74839, o.OutDir = "", t.TempDir()
	if err := writeBinaryImages(o, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(o.OutDir, "regression-issue-74839.oci.tar")); err == nil {
		t.Error("regression-issue-74839 written without its program")
	}
	o.Pause = ""
	if err := writeBinaryImages(o, t.TempDir()); err == nil {
		t.Error("pause written without its program")
	}
}

// TestTestImages builds every test image from Debian's packages (cached in
// bin/.debs, as for make image) and stand-in programs, and checks the
// shared root filesystem has what the e2e specs run; as root, it runs the
// tools in it. iperf is the real one where make node built it
// (bin/node/iperf), and then it runs as the IPerf2 spec runs it.
func TestTestImages(t *testing.T) {
	if testing.Short() {
		t.Skip("downloads Debian packages")
	}
	ctx := context.Background()
	o := standIns(t)
	o.CacheDir = filepath.Join(repoRoot(t), "bin", ".debs")
	realIperf := filepath.Join(repoRoot(t), "bin", "node", "iperf")
	if _, err := os.Stat(realIperf); err == nil {
		o.Iperf = realIperf
	} else {
		realIperf = ""
		t.Logf("iperf: a stand-in (%v; make node builds it)", err)
	}
	if netnsutil.Isolated() {
		if _, missing, err := resolve(ctx, o.CacheDir, testPackages); err != nil || len(missing) > 0 {
			t.Skipf("the test images' packages are not all in %s (%v), and this private network namespace cannot download them: build the test images once (go run ./hack/mkimage -test-images)", o.CacheDir, err)
		}
	}
	if err := BuildTestImages(ctx, o); err != nil {
		t.Fatal(err)
	}
	for _, w := range wantBinaryImages {
		checkImage(t, o.OutDir, w)
	}
	e2e := "registry.k8s.io/e2e-test-images/"
	root, agnhost := checkImage(t, o.OutDir, wantImage{
		file:       "agnhost.oci.tar",
		names:      []string{e2e + "agnhost:2.63.0", e2e + "agnhost:2.55", e2e + "agnhost:2.45"},
		entrypoint: []string{"/agnhost"}, cmd: []string{"pause"},
	})
	// agnhost's has one more layer: /coredns.
	if n := len(agnhost.RootFS.DiffIDs); n != 2 {
		t.Fatalf("agnhost.oci.tar has %d layers, want 2 (the root filesystem, then /coredns)", n)
	}
	for _, w := range []wantImage{
		{file: "glibc-dns-testing.oci.tar", names: []string{e2e + "glibc-dns-testing:2.0.0", "registry.k8s.io/build-image/distroless-iptables:v0.9.6"}, cmd: []string{"/bin/sh"}},
		{file: "busybox.oci.tar", names: []string{e2e + "busybox:1.37.0-1"}, cmd: []string{"sh"}},
		{file: "nginx.oci.tar", names: []string{e2e + "nginx:1.15-4"}, entrypoint: []string{"/agnhost", "netexec", "--http-port=80"}},
	} {
		other, cfg := checkImage(t, o.OutDir, w)
		if !slices.Equal(cfg.RootFS.DiffIDs, agnhost.RootFS.DiffIDs[:1]) {
			t.Errorf("%s has layers %q, agnhost.oci.tar %q: want agnhost's first one only", w.file, cfg.RootFS.DiffIDs, agnhost.RootFS.DiffIDs)
		}
		if _, err := os.Lstat(filepath.Join(other, "coredns")); err == nil {
			t.Errorf("%s has /coredns: want it in agnhost's image only", w.file)
		}
	}

	sameFile(t, filepath.Join(root, "agnhost"), o.Agnhost)
	sameFile(t, filepath.Join(root, "coredns"), o.CoreDNS)
	sameFile(t, filepath.Join(root, "usr/bin/iperf"), o.Iperf)
	// What the built iperf links besides libc.
	for _, lib := range []string{"usr/lib/x86_64-linux-gnu/libstdc++.so.6", "lib/x86_64-linux-gnu/libgcc_s.so.1"} {
		if _, err := os.Stat(filepath.Join(root, lib)); err != nil {
			t.Errorf("/%s is not in the image: %v", lib, err)
		}
	}
	sameFile(t, filepath.Join(root, "localhost.crt"), filepath.Join(o.PorterCerts, "localhost.crt"))
	sameFile(t, filepath.Join(root, "localhost.key"), filepath.Join(o.PorterCerts, "localhost.key"))
	if sh, err := os.Readlink(filepath.Join(root, "bin/sh")); err != nil || (filepath.Base(sh) != "dash" && filepath.Base(sh) != "bash") {
		t.Errorf("/bin/sh links to %q (%v), want dash or bash, not busybox", sh, err)
	}
	if nc, err := os.Readlink(filepath.Join(root, "bin/nc")); err != nil || nc != "nc.openbsd" {
		t.Errorf("/bin/nc links to %q (%v), want OpenBSD's", nc, err)
	}
	for f, want := range map[string]string{
		"etc/nsswitch.conf": "\nhosts: files dns\n",
		"etc/passwd":        "root:x:0:0:",
		"etc/group":         "\nnobody:x:65534:",
	} {
		if b, err := os.ReadFile(filepath.Join(root, f)); err != nil || !strings.Contains(string(b), want) {
			t.Errorf("/%s: %q (%v), want it to contain %q", f, b, err, want)
		}
	}
	for _, p := range []string{
		"usr/bin/getent", "bin/nc.openbsd", "usr/bin/curl", "usr/bin/wget", "usr/bin/dig", "usr/bin/nslookup",
		"usr/bin/mawk", "bin/ip", "bin/ss", "bin/ping", "bin/hostname", "usr/sbin/conntrack", "usr/bin/iperf",
	} {
		if fi, err := os.Stat(filepath.Join(root, p)); err != nil || fi.Mode()&0o111 == 0 {
			t.Errorf("/%s is not an executable file in the image (%v)", p, err)
		}
	}

	t.Run("tools", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("running the image's tools needs root (chroot)")
		}
		path := ""
		for _, e := range agnhost.Config.Env {
			if v, ok := strings.CutPrefix(e, "PATH="); ok {
				path = v
			}
		}
		for _, c := range []struct {
			cmd, want string
		}{
			{"ls /", "agnhost\n"},
			{"getent passwd nobody", "nobody:x:65534:65534:"},
			{"nc -h 2>&1", "\t-u\t"},
			{"curl --version", "curl "},
			{"wget --version", "GNU Wget"},
			{"dig -v 2>&1", "DiG "},
			{"nslookup -version", "nslookup "},
			{"awk 'BEGIN { print 6 * 7 }'", "42\n"},
			{"which conntrack", "/usr/sbin/conntrack\n"},
			{"conntrack --version", "conntrack "},
			{"nsenter --version", "util-linux"},
			{"ip -V; ss -V", "iproute2"},
			{"ping -V", "ping from iputils"},
			{"hostname; seq 1 3 | grep 2 | sed s/2/two/; timeout 1 sleep 0; date", "two\n"},
		} {
			cmd := exec.Command("/bin/sh", "-c", c.cmd)
			cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
			cmd.Dir, cmd.Env = "/", []string{"PATH=" + path}
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.Contains(string(out), c.want) {
				t.Errorf("sh -c %q in the image: %v\n%s\nwant output containing %q", c.cmd, err, out, c.want)
			}
		}
	})

	// The IPerf2 spec (test/e2e/network/networking_perf.go) runs
	// `iperf -e -p 6789 --reportstyle C -i 1 -c iperf2-server`, skips the
	// first line and wants 17 fields on every other (util_iperf.go).
	t.Run("iperf2", func(t *testing.T) {
		if realIperf == "" {
			t.Skip("no bin/node/iperf (make node)")
		}
		if !netnsutil.Isolated() {
			t.Skip("needs root: iperf runs chrooted in a private network namespace")
		}
		run := func(args ...string) *exec.Cmd {
			cmd := exec.Command("/usr/bin/iperf", args...)
			cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
			cmd.Dir, cmd.Env = "/", []string{"PATH=/usr/bin:/bin"}
			return cmd
		}
		if out, err := run("-v").CombinedOutput(); !strings.HasPrefix(string(out), "iperf version 2.") {
			t.Fatalf("iperf -v in the image: %v: %s", err, out)
		}
		server := run("-s", "-B", "127.0.0.1", "-p", "6789")
		if err := server.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { server.Process.Kill(); server.Wait() })
		testutil.Eventually(t, 10*time.Second, "the iperf server to listen", func() bool {
			c, err := net.Dial("tcp", "127.0.0.1:6789")
			if err == nil {
				c.Close()
			}
			return err == nil
		})
		out, err := run("-e", "-p", "6789", "--reportstyle", "C", "-i", "1", "-t", "2", "-c", "127.0.0.1").CombinedOutput()
		if err != nil {
			t.Fatalf("iperf client: %v: %s", err, out)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(lines) < 3 {
			t.Fatalf("iperf printed %d lines, want a header, intervals and a total:\n%s", len(lines), out)
		}
		for _, l := range lines[1:] {
			if n := len(strings.Split(l, ",")); n != 17 {
				t.Errorf("iperf printed %d fields, want 17: %q", n, l)
			}
		}
	})
}
