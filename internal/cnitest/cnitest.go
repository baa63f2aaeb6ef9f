// Package cnitest drives CNI plugins the way a container runtime does,
// through libcni, for weft's kernel tests and benchmarks.
package cnitest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// PathEnv names the directory holding weft (as "weft") and the reference
// plugins; `make build` fills bin/cni and `make test` exports it.
const PathEnv = "WEFT_CNI_PATH"

// BinDir returns the CNI bin dir: $WEFT_CNI_PATH, or bin/cni at the
// repository root found above the working directory.
func BinDir() (string, error) {
	if d := os.Getenv(PathEnv); d != "" {
		return checkBinDir(d)
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return checkBinDir(filepath.Join(dir, "bin", "cni"))
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory; set %s", PathEnv)
		}
		dir = parent
	}
}

func checkBinDir(d string) (string, error) {
	if _, err := os.Stat(filepath.Join(d, "weft")); err != nil {
		return "", fmt.Errorf("%s has no weft plugin (run `make build`): %w", d, err)
	}
	return d, nil
}

// Runtime is a minimal container runtime: a plugin path and a result cache.
type Runtime struct {
	CNI      *libcni.CNIConfig
	BinDir   string
	CacheDir string
}

// NewRuntime returns a runtime using the plugins in binDir and caching
// results in cacheDir, as containerd does under /var/lib/cni. Plugins'
// stderr goes to the process's.
func NewRuntime(binDir, cacheDir string) *Runtime {
	return NewRuntimeStderr(binDir, cacheDir, os.Stderr)
}

// NewRuntimeStderr is NewRuntime with the plugins' stderr going to w, which
// concurrent plugin runs may write at the same time.
func NewRuntimeStderr(binDir, cacheDir string, w io.Writer) *Runtime {
	return &Runtime{
		CNI:      libcni.NewCNIConfigWithCacheDir([]string{binDir}, cacheDir, &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: w}}),
		BinDir:   binDir,
		CacheDir: cacheDir,
	}
}

// Conflist builds a network configuration list from plugin configs.
func Conflist(version, name string, plugins ...map[string]any) (*libcni.NetworkConfigList, error) {
	raw, err := json.Marshal(map[string]any{"cniVersion": version, "name": name, "plugins": plugins})
	if err != nil {
		return nil, err
	}
	return libcni.NetworkConfFromBytes(raw)
}

// Attachment is one (container, interface) the runtime has added.
type Attachment struct {
	ContainerID string
	NetNS       string
	IfName      string
	Caps        map[string]any
	// Args are CNI_ARGS pairs, e.g. the pod's identity as Kubernetes
	// runtimes pass it (K8S_POD_NAMESPACE, K8S_POD_NAME, K8S_POD_UID).
	Args [][2]string
}

func (a Attachment) rt() *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: a.ContainerID, NetNS: a.NetNS, IfName: a.IfName, Args: a.Args, CapabilityArgs: a.Caps}
}

// Add runs ADD for the whole list and returns the result as 1.1.0.
func (r *Runtime) Add(ctx context.Context, list *libcni.NetworkConfigList, a Attachment) (*current.Result, error) {
	res, err := r.CNI.AddNetworkList(ctx, list, a.rt())
	if err != nil {
		return nil, err
	}
	return current.GetResult(res)
}

// Check runs CHECK for the whole list against the cached result.
func (r *Runtime) Check(ctx context.Context, list *libcni.NetworkConfigList, a Attachment) error {
	return r.CNI.CheckNetworkList(ctx, list, a.rt())
}

// Del runs DEL for the whole list.
func (r *Runtime) Del(ctx context.Context, list *libcni.NetworkConfigList, a Attachment) error {
	return r.CNI.DelNetworkList(ctx, list, a.rt())
}

// GC runs GC with the given attachments as the valid ones.
func (r *Runtime) GC(ctx context.Context, list *libcni.NetworkConfigList, valid []Attachment) error {
	args := &libcni.GCArgs{}
	for _, a := range valid {
		args.ValidAttachments = append(args.ValidAttachments, types.GCAttachment{ContainerID: a.ContainerID, IfName: a.IfName})
	}
	return r.CNI.GCNetworkList(ctx, list, args)
}

// Status runs STATUS for the whole list.
func (r *Runtime) Status(ctx context.Context, list *libcni.NetworkConfigList) error {
	return r.CNI.GetStatusNetworkList(ctx, list)
}
