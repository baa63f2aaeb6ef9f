package cni_test

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/weftnet/weft/internal/cnitest"
	"github.com/weftnet/weft/ipam"
)

// TestExhaustionStatusGC fills a /29, sees ADD and STATUS refuse, loses the
// runtime's cache, and has GC free everything that is not a valid attachment.
func TestExhaustionStatusGC(t *testing.T) {
	e := newEnv(t)
	list := e.list("1.1.0", "small", e.weft(subnet(smallNet)))
	ctx := context.Background()
	var pods []cnitest.Attachment
	for i := 0; i < 5; i++ {
		p := e.pod()
		e.add(list, p)
		pods = append(pods, p)
	}
	if err := e.rt.Status(ctx, list); err == nil || cniCode(err) != 50 {
		t.Fatalf("STATUS on a full range: got %v, want code 50", err)
	}
	extra := e.pod()
	_, err := e.rt.Add(ctx, list, extra)
	if err == nil || cniCode(err) != 11 {
		t.Fatalf("ADD on a full range: got %v, want code 11", err)
	}
	if l := podLinks(t, extra.NetNS); len(l) != 0 {
		t.Fatalf("failed ADD left links in the pod: %v", l)
	}
	if v := e.hostVeths(); len(v) != 5 {
		t.Fatalf("veths on the bridge after a failed ADD: %v, want 5", v)
	}

	// The runtime lost its cache (node reboot, containerd state wiped).
	if err := os.RemoveAll(e.rt.CacheDir); err != nil {
		t.Fatal(err)
	}
	valid := pods[:2]
	if err := e.rt.GC(ctx, list, valid); err != nil {
		t.Fatalf("GC: %v", err)
	}
	keys := e.allocations("small")
	if len(keys) != 2 || keys[0].ContainerID == keys[1].ContainerID {
		t.Fatalf("allocations after GC: %v, want the 2 valid ones", keys)
	}
	for _, k := range keys {
		if k.ContainerID != valid[0].ContainerID && k.ContainerID != valid[1].ContainerID {
			t.Fatalf("GC kept %v, which is not valid", k)
		}
	}
	if v := e.hostVeths(); len(v) != 2 {
		t.Fatalf("veths after GC: %v, want 2", v)
	}
	for _, p := range pods[2:] {
		if l := podLinks(t, p.NetNS); len(l) != 0 {
			t.Fatalf("GC left %v in stale pod %s", l, p.ContainerID)
		}
	}
	if l := podLinks(t, valid[0].NetNS); len(l) != 1 {
		t.Fatalf("GC touched valid pod %s: links %v", valid[0].ContainerID, l)
	}
	if err := e.rt.Status(ctx, list); err != nil {
		t.Fatalf("STATUS after GC: %v", err)
	}
	e.add(list, extra)
}

// TestParallelAdds runs 40 ADDs as 40 concurrent plugin processes.
func TestParallelAdds(t *testing.T) {
	const n = 40
	e := newEnv(t)
	list := e.list("1.1.0", "par", e.weft(subnet(podCIDR)))
	pods := make([]cnitest.Attachment, n)
	for i := range pods {
		pods[i] = e.pod()
	}
	ips := make([]net.IP, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range pods {
		wg.Go(func() {
			res, err := e.rt.Add(context.Background(), list, pods[i])
			if err == nil {
				ips[i] = res.IPs[0].Address.IP
			}
			errs[i] = err
		})
	}
	wg.Wait()
	seen := map[string]string{}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("ADD %d: %v", i, err)
		}
		if other, dup := seen[ips[i].String()]; dup {
			t.Fatalf("%s handed to both %s and %s", ips[i], other, pods[i].ContainerID)
		}
		seen[ips[i].String()] = pods[i].ContainerID
	}
	if v := e.hostVeths(); len(v) != n {
		t.Fatalf("%d veths on the bridge, want %d", len(v), n)
	}
	for i := range pods {
		wg.Go(func() { errs[i] = e.rt.Del(context.Background(), list, pods[i]) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("DEL %d: %v", i, err)
		}
	}
	if k := e.allocations("par"); len(k) != 0 {
		t.Fatalf("allocations left: %v", k)
	}
	if v := e.armedVeths(); len(v) != 0 {
		t.Fatalf("attachments still up after DEL: %v", v)
	}
}

// runPlugin executes the weft plugin directly, as a runtime would, and
// returns the started process.
func runPlugin(t *testing.T, e *env, command string, a cnitest.Attachment, conf []byte) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(filepath.Join(e.rt.BinDir, "weft"))
	cmd.Env = []string{
		"CNI_COMMAND=" + command, "CNI_CONTAINERID=" + a.ContainerID, "CNI_NETNS=" + a.NetNS,
		"CNI_IFNAME=" + a.IfName, "CNI_PATH=" + e.rt.BinDir,
	}
	cmd.Stdin = bytes.NewReader(conf)
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, &out
}

// TestKillMidAdd kills plugin processes at different moments of ADD; after
// GC nothing is left, and later ADDs still get distinct addresses.
func TestKillMidAdd(t *testing.T) {
	const kills = 30
	e := newEnv(t)
	conf := pluginConf(t, "1.1.0", "killed", e.weft(subnet(podCIDR)))
	list := e.list("1.1.0", "killed", e.weft(subnet(podCIDR)))
	// The bridge exists before the first kill, as on a node with pods.
	e.add(list, e.pod())
	if err := os.RemoveAll(e.rt.CacheDir); err != nil {
		t.Fatal(err)
	}
	partial := 0
	for i := 0; i < kills; i++ {
		p := e.pod()
		cmd, _ := runPlugin(t, e, "ADD", p, conf)
		time.Sleep(time.Duration(i) * 250 * time.Microsecond)
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
		if len(podLinks(t, p.NetNS)) > 0 {
			partial++
		}
	}
	t.Logf("%d of %d killed ADDs had already created the pod interface", partial, kills)
	if err := e.rt.GC(context.Background(), list, nil); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if k := e.allocations("killed"); len(k) != 0 {
		t.Fatalf("allocations left after GC: %v", k)
	}
	if v := e.hostVeths(); len(v) != 0 {
		t.Fatalf("veths left after GC: %v", v)
	}
	seen := map[string]bool{}
	for i := 0; i < 5; i++ {
		ip := e.add(list, e.pod()).String()
		if seen[ip] {
			t.Fatalf("%s handed out twice", ip)
		}
		seen[ip] = true
	}
}

// pluginConf is the stdin a runtime passes to the first plugin of a list.
func pluginConf(t *testing.T, version, name string, plugin map[string]any) []byte {
	t.Helper()
	conf := map[string]any{"cniVersion": version, "name": name}
	for k, v := range plugin {
		conf[k] = v
	}
	b, err := jsonMarshal(conf)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCorruptState: an unreadable store makes STATUS report 50 and ADD fail
// with the file named, and nothing is wired; the state is never reset.
func TestCorruptState(t *testing.T) {
	e := newEnv(t)
	list := e.list("1.1.0", "corrupt", e.weft(subnet(podCIDR)))
	e.add(list, e.pod())
	dir, err := ipam.NetworkDir(e.dataDir, "corrupt")
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state.json")
	if err := os.WriteFile(state, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := e.rt.Status(ctx, list); cniCode(err) != 50 {
		t.Fatalf("STATUS with a corrupt store: got %v, want code 50", err)
	}
	p := e.pod()
	_, err = e.rt.Add(ctx, list, p)
	if err == nil || !strings.Contains(err.Error(), "state.json") {
		t.Fatalf("ADD with a corrupt store: got %v, want an error naming state.json", err)
	}
	if l := podLinks(t, p.NetNS); len(l) != 0 {
		t.Fatalf("ADD with a corrupt store wired the pod: %v", l)
	}
	if b, _ := os.ReadFile(state); string(b) != "{not json" {
		t.Fatalf("the corrupt state was rewritten: %q", b)
	}
}
