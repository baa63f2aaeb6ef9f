package cniinstall

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/netnsutil"
)

func TestMain(m *testing.M) { os.Exit(netnsutil.RunTests(m)) }

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestInstall(t *testing.T) {
	from, to := t.TempDir(), filepath.Join(t.TempDir(), "bin")
	writeFile(t, filepath.Join(from, "weft"), "new weft")
	writeFile(t, filepath.Join(from, "portmap"), "our portmap")
	got, err := Install(from, to, []string{"weft"})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"portmap", "weft"}) {
		t.Fatalf("installed %v into an empty dir", got)
	}
	if fi, err := os.Stat(filepath.Join(to, "weft")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("weft installed as %v, %v: want mode 0755", fi, err)
	}

	// A second install replaces weft but keeps the node's own portmap.
	writeFile(t, filepath.Join(to, "portmap"), "the node's portmap")
	writeFile(t, filepath.Join(from, "weft"), "newer weft")
	if got, err = Install(from, to, []string{"weft"}); err != nil || !slices.Equal(got, []string{"weft"}) {
		t.Fatalf("second install: %v, %v", got, err)
	}
	if read(t, filepath.Join(to, "weft")) != "newer weft" || read(t, filepath.Join(to, "portmap")) != "the node's portmap" {
		t.Fatal("weft must be replaced and the node's portmap kept")
	}
	entries, _ := os.ReadDir(to)
	if len(entries) != 2 {
		t.Fatalf("%d files in the bin dir: a temporary file was left", len(entries))
	}
}

// TestInstallOrder: the files always replaced are installed last, in the
// order given, so that weft's shim never runs before the Go plugin it
// executes is in place.
func TestInstallOrder(t *testing.T) {
	from, to := t.TempDir(), t.TempDir()
	for _, n := range []string{"weft", "weft-plugin", "portmap", "bridge"} {
		writeFile(t, filepath.Join(from, n), n)
	}
	got, err := Install(from, to, []string{"weft-plugin", "weft"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"bridge", "portmap", "weft-plugin", "weft"}; !slices.Equal(got, want) {
		t.Fatalf("installed in the order %v, want %v", got, want)
	}
}

// TestInstallWhileRunning replaces a plugin binary that is executing,
// which an in-place write refuses with "text file busy".
func TestInstallWhileRunning(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep binary to run")
	}
	from, to := t.TempDir(), t.TempDir()
	body, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(from, "weft"), body, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Install(from, to, []string{"weft"}); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(to, "weft"), "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if _, err := Install(from, to, []string{"weft"}); err != nil {
		t.Fatalf("replacing a running plugin: %v", err)
	}
}

// TestInstallReadOnly: a read-only CNI bin dir (a node whose /opt/cni/bin
// is on a read-only filesystem) is an error naming the directory, with no
// file written. The directory is made read-only by a bind mount, inside the
// test's private mount namespace.
func TestInstallReadOnly(t *testing.T) {
	if !netnsutil.Isolated() {
		t.Skip("needs root to bind-mount a read-only directory in a private mount namespace")
	}
	from, to := t.TempDir(), t.TempDir()
	writeFile(t, filepath.Join(from, "weft"), "weft")
	if err := unix.Mount(to, to, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(to, 0)
	if err := unix.Mount("", to, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	_, err := Install(from, to, []string{"weft"})
	if err == nil || !strings.Contains(err.Error(), "CNI bin dir "+to) || !errors.Is(err, unix.EROFS) {
		t.Fatalf("error %v: want a read-only filesystem error naming the CNI bin dir", err)
	}
	if entries, _ := os.ReadDir(to); len(entries) != 0 {
		t.Fatalf("%d files written into a read-only dir", len(entries))
	}
}
