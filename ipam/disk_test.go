package ipam_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/ipam"
)

func TestNetworkDir(t *testing.T) {
	tests := []struct {
		dataDir, network, want string
	}{
		{"/var/lib/weft", "weft", "/var/lib/weft/weft"},
		{"/var/lib/weft", "k8s-pod-network.v1", "/var/lib/weft/k8s-pod-network.v1"},
		{"/var/lib/weft", "", ""},
		{"/var/lib/weft", ".", ""},
		{"/var/lib/weft", "..", ""},
		{"/var/lib/weft", "a/b", ""},
		{"/var/lib/weft", "../etc", ""},
		{"/var/lib/weft", "a\x00b", ""},
		{"/var/lib/weft", strings.Repeat("n", 256), ""},
		{"", "weft", ""},
	}
	for _, tt := range tests {
		got, err := ipam.NetworkDir(tt.dataDir, tt.network)
		if tt.want == "" {
			if err == nil {
				t.Errorf("NetworkDir(%q, %q) = %q, want error", tt.dataDir, tt.network, got)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("NetworkDir(%q, %q) = %q, %v; want %q", tt.dataDir, tt.network, got, err, tt.want)
		}
	}
}

func openDisk(t *testing.T, dir string) *ipam.DiskStore {
	t.Helper()
	s, err := ipam.NewDiskStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// tempFiles lists the files in dir other than the store's own: the lock,
// the state and boot files and the one temporary file of each (which,
// after a save, holds the previous version). Per-process temporary files
// would accumulate.
func tempFiles(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var stray []string
	for _, e := range entries {
		if !slices.Contains([]string{"lock", "state.json", "state.json.tmp", "boot", "boot.tmp"}, e.Name()) {
			stray = append(stray, e.Name())
		}
	}
	return stray
}

func TestDiskStore(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data", "weft")
	s := openDisk(t, dir)
	for _, p := range []string{filepath.Dir(dir), dir} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: mode %v, %v; want 0700", p, fi.Mode(), err)
		}
	}
	storeContract(t, s)
	if _, err := os.Stat(filepath.Join(dir, "lock")); err != nil {
		t.Errorf("lock file: %v", err)
	}
	if m := tempFiles(t, dir); len(m) != 0 {
		t.Errorf("temporary files left behind: %v", m)
	}

	// Round trip through a second store on the same directory.
	want, err := os.ReadFile(s.StatePath())
	if err != nil {
		t.Fatal(err)
	}
	if err := openDisk(t, dir).View(func(st *ipam.State) error {
		if got := encode(t, st); !bytes.Equal(got, want) {
			t.Errorf("reloaded state:\n%s\nwant\n%s", got, want)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// An Update that changes nothing does not rewrite the file.
	before, _ := os.Stat(s.StatePath())
	if err := s.Update(func(*ipam.State) error { return nil }); err != nil {
		t.Fatal(err)
	}
	after, _ := os.Stat(s.StatePath())
	if !os.SameFile(before, after) {
		t.Error("no-op Update replaced state.json")
	}
}

func TestDiskStoreCorrupt(t *testing.T) {
	for name, content := range map[string]string{
		"garbage":   "not json at all",
		"truncated": `{"version": 1, "allocations": [{"containerID": "a"`,
		"version":   `{"version": 7, "allocations": []}`,
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			s := openDisk(t, dir)
			if err := os.WriteFile(s.StatePath(), []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			called := false
			fn := func(*ipam.State) error { called = true; return nil }
			for op, err := range map[string]error{"Update": s.Update(fn), "View": s.View(fn)} {
				if !errors.Is(err, ipam.ErrCorruptState) || !strings.Contains(err.Error(), s.StatePath()) {
					t.Errorf("%s: error %v, want ErrCorruptState naming %s", op, err, s.StatePath())
				}
			}
			if called {
				t.Error("fn ran on a corrupt state")
			}
			if b, _ := os.ReadFile(s.StatePath()); string(b) != content {
				t.Errorf("corrupt file was rewritten: %q", b)
			}
		})
	}
}

// TestDiskStoreStaleTemp: temporary files left by processes killed
// mid-save, a torn state.json.tmp and an earlier version's
// state.json.tmp-<pid>, neither disturb reading nor accumulate: the next
// save overwrites the one, the first save of a boot removes the other.
func TestDiskStoreStaleTemp(t *testing.T) {
	dir := t.TempDir()
	s := openDisk(t, dir)
	for _, name := range []string{"state.json.tmp", "state.json.tmp-999999"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(`{"vers`), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.View(func(st *ipam.State) error { return nil }); err != nil {
		t.Fatalf("View with stale temp files: %v", err)
	}
	for _, id := range []string{"after-crash", "second"} {
		if err := allocateOnDisk(dir, id, nil); err != nil {
			t.Fatal(err)
		}
	}
	if m := tempFiles(t, dir); len(m) != 0 {
		t.Errorf("stale temporary files not removed: %v", m)
	}
	checkDistinct(t, dir, []string{"after-crash", "second"})
}

// TestDiskStoreReusesFiles: a save swaps the state file with its temporary
// file, so saves alternate between two files instead of creating one each
// time (and deleting the last), and the temporary file holds the previous
// state, whole.
func TestDiskStoreReusesFiles(t *testing.T) {
	dir := t.TempDir()
	s := openDisk(t, dir)
	var inodes []uint64
	var states [][]byte
	for _, id := range []string{"a", "b", "c", "d"} {
		if err := allocateOnDisk(dir, id, nil); err != nil {
			t.Fatal(err)
		}
		var st unix.Stat_t
		if err := unix.Stat(s.StatePath(), &st); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(s.StatePath())
		if err != nil {
			t.Fatal(err)
		}
		inodes, states = append(inodes, st.Ino), append(states, b)
	}
	if inodes[0] != inodes[2] || inodes[1] != inodes[3] || inodes[0] == inodes[1] {
		t.Errorf("state file inodes over four saves: %v; want two, alternating", inodes)
	}
	prev, err := os.ReadFile(s.StatePath() + ".tmp")
	if err != nil || string(prev) != string(states[2]) {
		t.Errorf("state.json.tmp after the fourth save: %q, %v; want the third save's state %q", prev, err, states[2])
	}
}

// dualPool is the pool used by the concurrency and helper-process tests.
func dualPool() (*ipam.Pool, error) {
	return ipam.NewPool([]ipam.RangeSet{
		{{Subnet: pfx("10.244.1.0/24")}},
		{{Subnet: pfx("fd00:10:244:1::/64")}},
	})
}

// allocateOnDisk allocates id in a DiskStore of its own on dir, then runs
// then (if not nil) while still holding the store's lock.
func allocateOnDisk(dir, id string, then func() error) error {
	p, err := dualPool()
	if err != nil {
		return err
	}
	s, err := ipam.NewDiskStore(dir)
	if err != nil {
		return err
	}
	return s.Update(func(st *ipam.State) error {
		if _, err := p.Allocate(st, key(id)); err != nil || then == nil {
			return err
		}
		return then()
	})
}

// checkDistinct asserts that dir's state holds exactly ids, each with two
// addresses, all distinct.
func checkDistinct(t *testing.T, dir string, ids []string) {
	t.Helper()
	err := openDisk(t, dir).View(func(st *ipam.State) error {
		if len(st.Allocations) != len(ids) {
			t.Errorf("%d allocations, want %d: %v", len(st.Allocations), len(ids), st.Keys())
		}
		for _, id := range ids {
			if !slices.Contains(st.Keys(), key(id)) {
				t.Errorf("no allocation for %s", id)
			}
		}
		seen := make(map[string]string)
		for _, al := range st.Allocations {
			if len(al.Addresses) != 2 {
				t.Errorf("%s: %d addresses, want 2", al.Key, len(al.Addresses))
			}
			for _, a := range al.Addresses {
				if other, dup := seen[a.String()]; dup {
					t.Errorf("%s handed to both %s and %s", a, other, al.Key)
				}
				seen[a.String()] = al.ContainerID
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestDiskStoreConcurrentStores(t *testing.T) {
	dir := t.TempDir()
	var wg sync.WaitGroup
	ids := make([]string, 20)
	for i := range ids {
		ids[i] = fmt.Sprint("goroutine-", i)
		wg.Go(func() {
			// Each goroutine opens its own store, like separate processes.
			if err := allocateOnDisk(dir, ids[i], nil); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	checkDistinct(t, dir, ids)
	if m := tempFiles(t, dir); len(m) != 0 {
		t.Errorf("temporary files left behind: %v", m)
	}
}

// TestDiskStoreBoots: the first save of a boot records the boot; a state
// file that does not parse is corrupt if it was saved in this boot, and
// read as empty if it was saved (without fsync) in an earlier one, whose
// crash also ended its pods; a parseable one from an earlier boot is kept.
func TestDiskStoreBoots(t *testing.T) {
	tmp := t.TempDir()
	bootID := filepath.Join(tmp, "boot_id")
	boot := func(id string) {
		t.Helper()
		if err := os.WriteFile(bootID, []byte(id+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	defer ipam.SetBootIDFile(bootID)()
	dir := filepath.Join(tmp, "net")
	s := openDisk(t, dir)
	pool, err := dualPool()
	if err != nil {
		t.Fatal(err)
	}
	keys := func() []ipam.Key {
		t.Helper()
		var k []ipam.Key
		if err := s.View(func(st *ipam.State) error { k = st.Keys(); return nil }); err != nil {
			t.Fatalf("View: %v", err)
		}
		return k
	}
	allocate := func(id string) error {
		return s.Update(func(st *ipam.State) error {
			_, err := pool.Allocate(st, ipam.Key{ContainerID: id, IfName: "eth0"})
			return err
		})
	}
	marked := func() string {
		b, _ := os.ReadFile(filepath.Join(dir, "boot"))
		return strings.TrimSpace(string(b))
	}

	boot("boot-a")
	for _, id := range []string{"a1", "a2"} {
		if err := allocate(id); err != nil {
			t.Fatal(err)
		}
	}
	if m := marked(); m != "boot-a" {
		t.Fatalf("recorded boot %q, want boot-a", m)
	}
	if k := keys(); len(k) != 2 {
		t.Fatalf("keys %v, want a1 and a2", k)
	}

	torn := []byte(`{"version": 1, "allocations": [{"contain`)
	if err := os.WriteFile(s.StatePath(), torn, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := allocate("a3"); !errors.Is(err, ipam.ErrCorruptState) {
		t.Fatalf("Update over a torn state of this boot: %v, want ErrCorruptState", err)
	}

	boot("boot-b") // the torn file was left by boot-a's crash
	if k := keys(); len(k) != 0 {
		t.Fatalf("keys of a torn state from an earlier boot: %v, want none", k)
	}
	if err := allocate("b1"); err != nil {
		t.Fatalf("Update over a torn state from an earlier boot: %v", err)
	}
	if m := marked(); m != "boot-b" {
		t.Fatalf("recorded boot %q, want boot-b", m)
	}

	boot("boot-c")
	if k := keys(); len(k) != 1 || k[0].ContainerID != "b1" {
		t.Fatalf("keys of a sound state from an earlier boot: %v, want b1 (GC releases it)", k)
	}
}

// TestDiskStoreSaveNotifies: every save shows as an inotify event naming
// state.json (IN_MOVED_TO), which is how weft-agent learns of new
// allocations without polling; the swap must keep announcing it.
func TestDiskStoreSaveNotifies(t *testing.T) {
	dir := t.TempDir()
	openDisk(t, dir)
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_MOVED_TO); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"first", "second", "third"} { // rename, then swaps
		if err := allocateOnDisk(dir, id, nil); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4096)
		n, err := unix.Read(fd, buf)
		if err != nil {
			t.Fatalf("save of %s: no inotify event: %v", id, err)
		}
		var names []string
		for b := buf[:n]; len(b) >= unix.SizeofInotifyEvent; {
			l := int(binary.NativeEndian.Uint32(b[12:16]))
			names = append(names, strings.TrimRight(string(b[unix.SizeofInotifyEvent:unix.SizeofInotifyEvent+l]), "\x00"))
			b = b[unix.SizeofInotifyEvent+l:]
		}
		if !slices.Contains(names, "state.json") {
			t.Errorf("save of %s moved %v, not state.json", id, names)
		}
	}
}
