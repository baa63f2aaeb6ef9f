package ipam

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

const (
	lockFile   = "lock"
	stateFile  = "state.json"
	bootFile   = "boot"
	tempInfix  = ".tmp-"
	maxNameLen = 255 // NAME_MAX
)

// bootIDFile holds the kernel's random ID of the current boot.
var bootIDFile = "/proc/sys/kernel/random/boot_id"

// NetworkDir returns the directory holding the state of network under
// dataDir, rejecting network names that are not a single path element.
func NetworkDir(dataDir, network string) (string, error) {
	switch {
	case dataDir == "":
		return "", errors.New("ipam data directory: empty")
	case network == "":
		return "", errors.New("network name: empty")
	case network == "." || network == "..":
		return "", fmt.Errorf("network name %q: not usable as a directory name", network)
	case strings.ContainsAny(network, "/\x00"):
		return "", fmt.Errorf("network name %q: must not contain '/' or NUL", network)
	case len(network) > maxNameLen:
		return "", fmt.Errorf("network name %q: longer than %d bytes", network, maxNameLen)
	}
	return filepath.Join(dataDir, network), nil
}

// DiskStore is a Store backed by a directory: dir/lock is flock'd around
// every operation (and never deleted) and dir/state.json holds the State,
// replaced atomically on every change. It is safe for concurrent use by
// goroutines and processes; each operation opens its own lock descriptor.
//
// Durability is paid once per boot, not once per change. dir/boot names
// the boot (the kernel's boot_id) since which state.json has been replaced
// without fsync. The first save of a boot writes state.json durably
// (fsync, rename, fsync of the directory) and only then records the boot,
// durably too; later saves of that boot write and rename without fsync,
// which within one running kernel is just as atomic for every reader and
// survives any process being killed. Only a kernel crash or power loss can
// then leave state.json stale or torn, and it also ends every pod the
// state describes: a state.json that does not parse while dir/boot names
// another boot is read as empty instead of as corrupt.
type DiskStore struct {
	dir string
}

var _ Store = (*DiskStore)(nil)

// NewDiskStore opens the store in dir, creating dir (mode 0700) and the
// lock file as needed. It does not read the state.
func NewDiskStore(dir string) (*DiskStore, error) {
	if dir == "" {
		return nil, errors.New("open ipam store: empty directory")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open ipam store: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open ipam store: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("open ipam store: %w", err)
	}
	return &DiskStore{dir: dir}, nil
}

// Dir returns the store's directory.
func (s *DiskStore) Dir() string { return s.dir }

// StatePath returns the path of the state file.
func (s *DiskStore) StatePath() string { return filepath.Join(s.dir, stateFile) }

// Update implements Store. It holds LOCK_EX on dir/lock while it loads the
// state, runs fn and, if fn succeeded and changed the state, saves it.
func (s *DiskStore) Update(fn func(*State) error) error {
	warmCodec()
	unlock, err := s.lock(unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer unlock()
	// Only the lock holder writes temporary files, so any found now were
	// left by a process that died mid-save. Removing them is best effort.
	s.removeTemps()

	st, before, err := s.load()
	if err != nil {
		return err
	}
	if err := fn(st); err != nil {
		return err
	}
	after, err := MarshalState(st)
	if err != nil {
		return err
	}
	if bytes.Equal(before, after) {
		return nil
	}
	return s.save(after)
}

// View implements Store. It holds LOCK_SH on dir/lock while fn runs;
// changes fn makes are discarded.
func (s *DiskStore) View(fn func(*State) error) error {
	warmCodec()
	unlock, err := s.lock(unix.LOCK_SH)
	if err != nil {
		return err
	}
	defer unlock()
	st, _, err := s.load()
	if err != nil {
		return err
	}
	return fn(st)
}

// warmCodec encodes and decodes a small state once per process, before
// the first lock is taken. A process's first encoding builds the JSON
// codec's caches for the state's types and grows the heap; in the CNI
// plugin, a process per command, that is a good part of the time the
// node-wide lock would be held, and every pod starting at the same time
// queues behind it.
var warmCodec = sync.OnceFunc(func() {
	st := NewState()
	st.put(Key{ContainerID: "warm", IfName: "eth0"}, []netip.Addr{netip.IPv4Unspecified(), netip.IPv6Unspecified()})
	st.SetPod(Key{ContainerID: "warm", IfName: "eth0"}, &PodRef{Namespace: "warm", Name: "warm", UID: "warm"})
	if b, err := MarshalState(st); err == nil {
		_, _ = UnmarshalState(b)
	}
})

// lock opens dir/lock and flocks it (blocking). The returned function
// unlocks and closes it. The descriptor is close-on-exec, so a child
// process never inherits the lock.
func (s *DiskStore) lock(how int) (unlock func(), err error) {
	path := filepath.Join(s.dir, lockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock ipam store: %w", err)
	}
	fd := int(f.Fd())
	for {
		err = unix.Flock(fd, how)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("lock ipam store: flock %s: %w", path, err)
	}
	return func() {
		// Closing the only descriptor of the open file releases the lock
		// anyway; the explicit unlock just makes the intent plain.
		_ = unix.Flock(fd, unix.LOCK_UN)
		_ = f.Close()
	}, nil
}

// load reads the state file; a missing file is an empty State. It also
// returns what Update compares the encoding of the changed state with: the
// file's bytes, which are MarshalState's output (one encoding less under
// the lock; a file formatted otherwise is rewritten once), or, for a
// missing or crash-torn file, the encoding of the empty state.
func (s *DiskStore) load() (*State, []byte, error) {
	path := s.StatePath()
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return encoded(NewState())
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read ipam state: %w", err)
	}
	st, err := UnmarshalState(b)
	if err != nil {
		if mark, boot := s.markedBoot(), currentBoot(); boot != "" && mark != "" && mark != boot {
			// Saved without fsync in a boot that ended in a crash,
			// which also ended the pods it described.
			return encoded(NewState())
		}
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return st, b, nil
}

func encoded(st *State) (*State, []byte, error) {
	b, err := MarshalState(st)
	if err != nil {
		return nil, nil, err
	}
	return st, b, nil
}

// save replaces the state file with b atomically, durably on the first
// save of a boot (then recording the boot), without fsync after that.
func (s *DiskStore) save(b []byte) error {
	boot := currentBoot()
	durable := boot == "" || s.markedBoot() != boot
	if err := s.replace(stateFile, b, durable); err != nil {
		return fmt.Errorf("save ipam state: %w", err)
	}
	if durable && boot != "" {
		if err := s.replace(bootFile, []byte(boot+"\n"), true); err != nil {
			return fmt.Errorf("save ipam state: recording the boot: %w", err)
		}
	}
	return nil
}

// replace writes b to a temporary file and renames it over dir/name. When
// durable, the file is fsynced before the rename and the directory after.
func (s *DiskStore) replace(name string, b []byte, durable bool) error {
	tmp := filepath.Join(s.dir, name+tempInfix+strconv.Itoa(os.Getpid()))
	if err := writeFile(tmp, b, durable); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, filepath.Join(s.dir, name)); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if durable {
		return syncDir(s.dir)
	}
	return nil
}

// markedBoot returns the boot recorded in dir/boot, "" if none.
func (s *DiskStore) markedBoot() string {
	b, err := os.ReadFile(filepath.Join(s.dir, bootFile))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// currentBoot returns the ID of the running boot, "" if the kernel does not
// tell (then every save is durable).
func currentBoot() string {
	b, err := os.ReadFile(bootIDFile)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// removeTemps deletes leftover temporary state files; errors are ignored
// because a leftover file is harmless.
func (s *DiskStore) removeTemps() {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), stateFile+tempInfix) || strings.HasPrefix(e.Name(), bootFile+tempInfix) {
			_ = os.Remove(filepath.Join(s.dir, e.Name()))
		}
	}
}

func writeFile(path string, b []byte, sync bool) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		_ = f.Close()
		return err
	}
	if sync {
		if err := f.Sync(); err != nil {
			_ = f.Close()
			return err
		}
	}
	return f.Close()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		_ = d.Close()
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return d.Close()
}
