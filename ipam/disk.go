package ipam

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

const (
	lockFile  = "lock"
	stateFile = "state.json"
	bootFile  = "boot"
	// tempSuffix names the file a save writes before swapping it with its
	// target. Only the lock holder saves, so one name per target is enough,
	// and a file left torn by a process killed mid-save (the target is
	// intact) is simply overwritten by the next save.
	tempSuffix = ".tmp"
	// oldTempInfix started the per-process temporary files of earlier
	// versions (state.json.tmp-<pid>); the first save of a boot removes
	// any they left.
	oldTempInfix = ".tmp-"
	maxNameLen   = 255 // NAME_MAX
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
// replaced atomically on every change: the new state is written to
// dir/state.json.tmp, and the two names are swapped (see replace), so that
// state.json.tmp then holds the previous state. It is safe for concurrent
// use by goroutines and processes; each operation opens its own lock
// descriptor.
//
// Durability is paid once per boot, not once per change. dir/boot names
// the boot (the kernel's boot_id) since which state.json has been replaced
// without fsync. The first save of a boot writes state.json durably
// (fsync, swap, fsync of the directory) and only then records the boot,
// durably too; later saves of that boot write and swap without fsync,
// which within one running kernel is just as atomic for every reader and
// survives any process being killed (mid-write, it leaves state.json.tmp
// torn and state.json whole). Only a kernel crash or power loss can then
// leave state.json stale or torn, and it also ends every pod the state
// describes: a state.json that does not parse while dir/boot names
// another boot is read as empty instead of as corrupt.
type DiskStore struct {
	dir string
}

var _ Store = (*DiskStore)(nil)

// NewDiskStore opens the store in dir, creating dir (mode 0700) as needed;
// every operation creates the lock file if it is missing. It does not read
// the state.
func NewDiskStore(dir string) (*DiskStore, error) {
	if dir == "" {
		return nil, errors.New("open ipam store: empty directory")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
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
//
// Every process that starts a pod waits for this lock, so what can be done
// before it is: the JSON codec warmed up, the boot IDs read (see save).
func (s *DiskStore) Update(fn func(*State) error) error {
	warmCodec()
	boots := s.boots()
	unlock, err := s.lock(unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer unlock()

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
	return s.save(after, boots)
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

// bootMarks is the running boot's ID and the one dir/boot records.
type bootMarks struct{ current, marked string }

// boots reads the boot IDs save needs. It may run before the lock: the
// running boot's ID never changes, and dir/boot, replaced atomically, only
// ever changes to the running boot's ID; if it changes between this read
// and the save, the save is durable without need, never the other way.
func (s *DiskStore) boots() bootMarks {
	return bootMarks{current: currentBoot(), marked: s.markedBoot()}
}

// save replaces the state file with b atomically, durably on the first
// save of a boot (then recording the boot, and removing the temporary
// files earlier versions may have left), without fsync after that.
func (s *DiskStore) save(b []byte, boots bootMarks) error {
	durable := boots.current == "" || boots.marked != boots.current
	if err := s.replace(stateFile, b, durable); err != nil {
		return fmt.Errorf("save ipam state: %w", err)
	}
	if durable && boots.current != "" {
		if err := s.replace(bootFile, []byte(boots.current+"\n"), true); err != nil {
			return fmt.Errorf("save ipam state: recording the boot: %w", err)
		}
		s.removeOldTemps()
	}
	return nil
}

// replace puts b in dir/name atomically: it writes b over dir/name.tmp,
// then swaps the two names in one step (RENAME_EXCHANGE), so that the
// next save rewrites the file that held the previous state instead of
// creating one: a new inode per save, the old one's deletion, and the
// write-back that ext4 starts when a rename replaces a file, all under the
// node-wide lock, cost more than the write. Where the target does not
// exist yet or the file system cannot swap, it renames. When durable, the
// file is fsynced before and the directory after.
func (s *DiskStore) replace(name string, b []byte, durable bool) error {
	tmp, target := filepath.Join(s.dir, name+tempSuffix), filepath.Join(s.dir, name)
	if err := overwrite(tmp, b, durable); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, target, unix.RENAME_EXCHANGE); err != nil {
		if err := os.Rename(tmp, target); err != nil {
			_ = os.Remove(tmp)
			return err
		}
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

// removeOldTemps deletes the per-process temporary files of earlier
// versions, left by processes killed mid-save; errors are ignored because
// a leftover file is harmless.
func (s *DiskStore) removeOldTemps() {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), stateFile+oldTempInfix) || strings.HasPrefix(e.Name(), bootFile+oldTempInfix) {
			_ = os.Remove(filepath.Join(s.dir, e.Name()))
		}
	}
}

// overwrite makes the file at path hold b, writing over what it holds and
// cutting it to len(b) (never to zero first: ext4 would then write the file
// back on close).
func overwrite(path string, b []byte, sync bool) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteAt(b, 0)
	if err == nil {
		err = f.Truncate(int64(len(b)))
	}
	if err == nil && sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
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
