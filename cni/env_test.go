package cni_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"

	"github.com/weftnet/weft/internal/cnitest"
	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/internal/nlutil"
	"github.com/weftnet/weft/ipam"
)

// The test address plan: the node running the tests is the test process's
// own (private) network namespace; pods hang off its bridge; an "external"
// host sits on the node network.
const (
	podCIDR  = "10.244.1.0/24"
	podGW    = "10.244.1.1"
	podCIDR6 = "fd00:10:244:1::/64"
	podGW6   = "fd00:10:244:1::1"
	smallNet = "10.244.2.0/29" // gateway .1, usable .2-.6: five pods
	nodeIP   = "172.18.0.1"
	extIP    = "172.18.0.100"
	nodeBits = 24
	testMTU  = 1450
)

func TestMain(m *testing.M) { os.Exit(netnsutil.RunTests(m)) }

// env is one kernel test's world: a runtime, a bridge and a state dir of its own.
type env struct {
	t       *testing.T
	rt      *cnitest.Runtime
	bridge  string
	dataDir string
	seq     atomic.Int32
}

var envSeq atomic.Int32

func newEnv(t *testing.T) *env {
	t.Helper()
	if testing.Short() {
		t.Skip("kernel test: skipped with -short")
	}
	if !netnsutil.Isolated() {
		t.Skip("kernel test: needs root to run in a private network namespace")
	}
	bin, err := cnitest.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	e := &env{
		t:       t,
		rt:      cnitest.NewRuntime(bin, filepath.Join(dir, "cache")),
		bridge:  fmt.Sprintf("wtest%d", envSeq.Add(1)),
		dataDir: filepath.Join(dir, "ipam"),
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(e.bridge); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	return e
}

// weft returns the weft plugin's config with the given range sets.
func (e *env) weft(sets ...[]map[string]any) map[string]any {
	return map[string]any{
		"type": "weft", "bridge": e.bridge, "mtu": testMTU,
		"ipam": map[string]any{"ranges": sets, "dataDir": e.dataDir},
	}
}

func subnet(cidr string) []map[string]any { return []map[string]any{{"subnet": cidr}} }

func (e *env) list(version, name string, plugins ...map[string]any) *libcni.NetworkConfigList {
	e.t.Helper()
	l, err := cnitest.Conflist(version, name, plugins...)
	if err != nil {
		e.t.Fatal(err)
	}
	return l
}

// pod creates a pod network namespace, removed when the test ends.
func (e *env) pod() cnitest.Attachment {
	e.t.Helper()
	name := fmt.Sprintf("%s-%d", sanitize(e.t.Name()), e.seq.Add(1))
	path, err := netnsutil.NewNamed(name)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = netnsutil.Delete(name) })
	return cnitest.Attachment{ContainerID: "ctr-" + name, NetNS: path, IfName: "eth0"}
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9]+`)

func sanitize(s string) string {
	s = unsafeChars.ReplaceAllString(s, "")
	if len(s) > 24 {
		s = s[len(s)-24:]
	}
	return strings.ToLower(s)
}

func (e *env) add(list *libcni.NetworkConfigList, a cnitest.Attachment) net.IP {
	e.t.Helper()
	res, err := e.rt.Add(context.Background(), list, a)
	if err != nil {
		e.t.Fatalf("ADD %s: %v", a.ContainerID, err)
	}
	if len(res.IPs) == 0 {
		e.t.Fatalf("ADD %s: no IPs in result %+v", a.ContainerID, res)
	}
	return res.IPs[0].Address.IP
}

func (e *env) del(list *libcni.NetworkConfigList, a cnitest.Attachment) {
	e.t.Helper()
	if err := e.rt.Del(context.Background(), list, a); err != nil {
		e.t.Fatalf("DEL %s: %v", a.ContainerID, err)
	}
}

// allocations reads the plugin's own state for network name.
func (e *env) allocations(name string) []ipam.Key {
	e.t.Helper()
	dir, err := ipam.NetworkDir(e.dataDir, name)
	if err != nil {
		e.t.Fatal(err)
	}
	store, err := ipam.NewDiskStore(dir)
	if err != nil {
		e.t.Fatal(err)
	}
	var keys []ipam.Key
	if err := store.View(func(st *ipam.State) error { keys = st.Keys(); return nil }); err != nil {
		e.t.Fatal(err)
	}
	return keys
}

// hostVeths lists the weft veths attached to the env's bridge.
func (e *env) hostVeths() []string { return e.bridgePorts(false) }

// armedVeths lists the bridge ports that are up: attachments not deleted.
func (e *env) armedVeths() []string { return e.bridgePorts(true) }

// waitNoVeths waits for the kernel to destroy the disarmed veth pairs once
// their pod namespaces are gone (it does so asynchronously, in batches).
func (e *env) waitNoVeths() {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(e.hostVeths()) > 0 {
		if time.Now().After(deadline) {
			e.t.Fatalf("veths still on the bridge 10s after their namespaces were deleted: %v", e.hostVeths())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// deletePod stops the pod's servers and removes its namespace, as the
// runtime does after DEL.
func deletePod(t *testing.T, a cnitest.Attachment) {
	t.Helper()
	servers.Lock()
	for _, ln := range servers.byNS[a.NetNS] {
		ln.Close()
	}
	delete(servers.byNS, a.NetNS)
	servers.Unlock()
	if err := netnsutil.Delete(strings.TrimPrefix(a.NetNS, netnsutil.RunDir+"/")); err != nil {
		t.Fatal(err)
	}
}

func (e *env) bridgePorts(upOnly bool) []string {
	e.t.Helper()
	br, err := netlink.LinkByName(e.bridge)
	if err != nil {
		return nil
	}
	links, err := nlutil.Dump("links", netlink.LinkList)
	if err != nil {
		e.t.Fatal(err)
	}
	var names []string
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index && (!upOnly || l.Attrs().Flags&net.FlagUp != 0) {
			names = append(names, l.Attrs().Name)
		}
	}
	return names
}

// podLinks lists the links in a pod namespace other than lo.
func podLinks(t *testing.T, path string) []string {
	t.Helper()
	var names []string
	err := netnsutil.Do(path, func() error {
		links, err := nlutil.Dump("links", netlink.LinkList)
		for _, l := range links {
			if l.Attrs().Name != "lo" {
				names = append(names, l.Attrs().Name)
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// servers tracks listeners by pod namespace: an open socket keeps its
// namespace (and so a disarmed veth pair) alive, as a running process would.
var servers = struct {
	sync.Mutex
	byNS map[string][]net.Listener
}{byNS: map[string][]net.Listener{}}

// serve starts a TCP server inside the namespace at path (the node's own when
// path is empty) that answers each line with "<name> saw <client address>".
func serve(t *testing.T, path, name, addr string) {
	t.Helper()
	var ln net.Listener
	err := inNS(path, func() (err error) { ln, err = net.Listen("tcp", addr); return err })
	if err != nil {
		t.Fatalf("listening in %s: %v", path, err)
	}
	t.Cleanup(func() { ln.Close() })
	if path != "" {
		servers.Lock()
		servers.byNS[path] = append(servers.byNS[path], ln)
		servers.Unlock()
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
					return
				}
				host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
				fmt.Fprintf(c, "%s saw %s\n", name, host)
			}()
		}
	}()
}

// inNS runs fn in the namespace at path, or in the node's when path is empty.
func inNS(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	return netnsutil.Do(path, fn)
}

// exchange connects from the namespace at path (the node when empty) to dst,
// sends a line and returns the answer.
func exchange(path, dst string) (string, error) {
	return exchangeTimeout(path, dst, 3*time.Second)
}

// unreachable reports whether a TCP exchange with dst fails; a cut-off peer
// answers nothing, so a short timeout suffices.
func unreachable(path, dst string) bool {
	_, err := exchangeTimeout(path, dst, 300*time.Millisecond)
	return err != nil
}

func exchangeTimeout(path, dst string, timeout time.Duration) (string, error) {
	var c net.Conn
	err := inNS(path, func() (err error) { c, err = net.DialTimeout("tcp", dst, timeout); return err })
	if err != nil {
		return "", fmt.Errorf("dialing %s: %w", dst, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := fmt.Fprintln(c, "hello"); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

func mustExchange(t *testing.T, path, dst, want string) {
	t.Helper()
	got, err := exchange(path, dst)
	if err != nil {
		t.Fatalf("TCP exchange with %s from %q: %v", dst, path, err)
	}
	if got != want {
		t.Fatalf("TCP exchange with %s from %q: got %q, want %q", dst, path, got, want)
	}
}

// cniCode extracts the spec error code from a plugin error.
func cniCode(err error) uint {
	var te *types.Error
	if errors.As(err, &te) {
		return te.Code
	}
	return 0
}
