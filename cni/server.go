package cni

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"golang.org/x/sys/unix"
)

// The resident command server. Most of a plugin process's cost is its own
// start and exit (the Go runtime, package initialisers, page faults; see
// docs/cni.md), so the file the runtime executes, `<cni bin dir>/weft`, is
// a small static C program (cmd/weft-cni/shim/weft.c) that hands the
// command to a resident process of the Go plugin, `weft-plugin serve-cni`,
// and relays its answer: what the plugin process would have printed on
// stdout and stderr, and its exit status. When no server answers, or the
// one that does runs an older binary than the installed weft-plugin, or
// the exchange fails before the command has started, the shim executes
// weft-plugin with the same arguments, environment and stdin instead, and
// (with ServeEnv set) that process starts a server for the next commands.
//
// Like the reaper, the server listens on an abstract unix socket, which
// belongs to the network namespace: every node has its own, and a server
// runs with the privileges and namespaces of the plugin execution that
// started it (the runtime's), never the agent's. It serves root peers
// only, runs each command on a goroutine of its own (namespace switches
// happen on locked threads; commands use no process-wide state, see
// CmdArgs), and exits once it has been idle for reaperIdle.
//
// The exchange, in the machine's byte order:
//
//	request: "WFT1", the identity of the weft-plugin file the shim would
//	         execute (st_dev, st_ino, st_mtim seconds and nanoseconds: four
//	         64-bit integers), the length of the environment and of stdin
//	         (32 bits each), the environment (NUL-terminated KEY=VALUE
//	         strings), stdin.
//	answer:  one byte: 'A' when the command starts; after it the shim never
//	         runs the command itself, and a broken exchange is a CNI error.
//	         'S' (this server is stale: it stops listening) or 'R'
//	         (refused) send the shim to weft-plugin.
//	         After 'A': exit status, stdout length, stderr length (32 bits
//	         each), stdout, stderr.
const (
	serverSocket = "@weft-cni-server"
	// ServeArg runs the plugin binary as the node's command server.
	ServeArg = "serve-cni"
	// ServeEnv, set by the shim when it executes weft-plugin because no
	// current server answered, makes the plugin start one once its command
	// is done.
	ServeEnv = "WEFT_CNI_SERVE"
	// serverIO bounds reading a request and writing an answer.
	serverIO = 5 * time.Second
	// maxRequestPart bounds the environment and stdin of a request.
	maxRequestPart = 4 << 20

	requestMagic    = "WFT1"
	answerAccepted  = 'A'
	answerStale     = 'S'
	answerRefused   = 'R'
	requestHeadSize = 4 + 4*8 + 2*4
)

// fileID identifies a binary file: a replaced (renamed over) file has
// another inode, a rewritten one another modification time.
type fileID struct {
	dev, ino, sec, nsec uint64
}

func statID(path string) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fileID{}, err
	}
	return fileID{st.Dev, st.Ino, uint64(st.Mtim.Sec), uint64(st.Mtim.Nsec)}, nil
}

// Serve runs the node's command server unless another one already serves.
// It is what `weft-plugin serve-cni` runs.
func Serve(cmds Commands, about string) error {
	// The file this process runs, even if it has been replaced since.
	self, err := statID("/proc/self/exe")
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	ln, err := net.Listen("unix", serverSocket)
	if err != nil {
		return nil // another server serves the node
	}
	s := &server{cmds: cmds, about: about, self: self, ln: ln.(*net.UnixListener)}
	s.serve()
	return nil
}

type server struct {
	cmds      Commands
	about     string
	self      fileID
	ln        *net.UnixListener
	closeOnce sync.Once
}

// serve accepts commands until none came for reaperIdle or the server
// found itself stale, then waits for the commands it runs.
func (s *server) serve() {
	var busy sync.WaitGroup
	defer busy.Wait()
	defer s.stop()
	for {
		if err := s.ln.SetDeadline(time.Now().Add(reaperIdle)); err != nil {
			return
		}
		conn, err := s.ln.AcceptUnix()
		if err != nil {
			return // idle, stale or broken: the next command starts a server
		}
		busy.Go(func() { s.serveConn(conn) })
	}
}

// stop closes the listener, freeing the socket's name for a new server.
func (s *server) stop() { s.closeOnce.Do(func() { _ = s.ln.Close() }) }

func (s *server) serveConn(conn *net.UnixConn) {
	defer conn.Close()
	start := time.Now()
	_ = conn.SetDeadline(start.Add(serverIO))
	if !rootPeer(conn) {
		_, _ = conn.Write([]byte{answerRefused})
		return
	}
	env, stdin, id, err := readRequest(bufio.NewReader(conn))
	if err != nil {
		_, _ = conn.Write([]byte{answerRefused})
		return
	}
	if id != s.self {
		// Another weft-plugin is installed: stop listening, so that the
		// process the shim now executes can start a current server.
		s.stop()
		_, _ = conn.Write([]byte{answerStale})
		return
	}
	if _, err := conn.Write([]byte{answerAccepted}); err != nil {
		return // the shim is gone; nothing has started
	}
	// A command may wait long (e.g. for the node's IPAM lock).
	_ = conn.SetDeadline(time.Time{})
	var stdout, stderr bytes.Buffer
	status := s.run(env, stdin, &stdout, &stderr, start)
	_ = conn.SetDeadline(time.Now().Add(serverIO))
	head := make([]byte, 12)
	binary.NativeEndian.PutUint32(head, uint32(status))
	binary.NativeEndian.PutUint32(head[4:], uint32(stdout.Len()))
	binary.NativeEndian.PutUint32(head[8:], uint32(stderr.Len()))
	bufs := net.Buffers{head, stdout.Bytes(), stderr.Bytes()}
	_, _ = bufs.WriteTo(conn)
}

// run serves one command as a plugin process would; a panic is the
// command's internal error, not the server's end.
func (s *server) run(env map[string]string, stdin []byte, stdout, stderr *bytes.Buffer, start time.Time) (status int) {
	defer func() {
		if p := recover(); p != nil {
			stdout.Reset()
			_ = printJSON(stdout, types.NewError(types.ErrInternal, fmt.Sprintf("weft plugin server: %v", p), ""))
			status = 1
		}
	}()
	getenv := func(k string) string { return env[k] }
	return Run(s.cmds, s.about, getenv, bytes.NewReader(stdin), stdout, stderr, start)
}

// readRequest reads a request: the environment, stdin and the identity of
// the binary the shim would otherwise execute.
func readRequest(r io.Reader) (env map[string]string, stdin []byte, id fileID, err error) {
	head := make([]byte, requestHeadSize)
	if _, err := io.ReadFull(r, head); err != nil {
		return nil, nil, id, err
	}
	if string(head[:4]) != requestMagic {
		return nil, nil, id, errors.New("not a weft CNI request")
	}
	u64 := func(i int) uint64 { return binary.NativeEndian.Uint64(head[4+8*i:]) }
	id = fileID{u64(0), u64(1), u64(2), u64(3)}
	envLen := binary.NativeEndian.Uint32(head[36:])
	stdinLen := binary.NativeEndian.Uint32(head[40:])
	if envLen > maxRequestPart || stdinLen > maxRequestPart {
		return nil, nil, id, errors.New("request too large")
	}
	body := make([]byte, int(envLen)+int(stdinLen))
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, nil, id, err
	}
	env = map[string]string{}
	for kv := range strings.SplitSeq(string(body[:envLen]), "\x00") {
		// As getenv: the first definition of a name counts.
		if k, v, ok := strings.Cut(kv, "="); ok {
			if _, seen := env[k]; !seen {
				env[k] = v
			}
		}
	}
	return env, body[envLen:], id, nil
}

// StartServer starts the node's command server, detached, unless one
// answers already; it does not wait for the new one to serve (a command
// the shim sends meanwhile runs as a process, as this one did).
func StartServer() error {
	if conn, err := net.Dial("unix", serverSocket); err == nil {
		_ = conn.Close()
		return nil
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("starting the plugin server: %w", err)
	}
	cmd := exec.Command(self, ServeArg)
	cmd.Dir = "/"
	cmd.Env = []string{}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // not in the runtime's process group
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting the plugin server: %w", err)
	}
	return cmd.Process.Release()
}
