package kubelet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weftnet/weft/internal/fsutil"
	"github.com/weftnet/weft/internal/image"
	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/internal/proc"
)

// Pods whose containers all use weft's image (ImageRepo) run that image:
// init containers to completion, then every container under the pod's
// restart policy (the kubelet restarts a container that exits), with
// httpGet readiness and liveness probes, the pod's env (values, the
// downward API, ConfigMap references), its volumes (hostPath within the
// node, ConfigMaps, projected service account tokens) and a graceful stop
// on deletion. Any other pod runs the lab workload.

// ImageRepo is weft's image repository; its tags map to binary directories.
const ImageRepo = "ghcr.io/weftnet/weft"

// containerRun is one container of an image pod.
type containerRun struct {
	Name      string    `json:"name"`
	PID       int       `json:"pid"`
	Restarts  int32     `json:"restarts"`
	Started   time.Time `json:"started"`
	Ready     bool      `json:"ready"`
	LastExit  string    `json:"lastExit,omitempty"`
	nextStart time.Time
	failures  int // consecutive liveness failures
}

// imageTag returns the tag of weft's image a pod runs, and false when a
// container of it uses another image.
func imageTag(pod *corev1.Pod) (string, bool) {
	tag := ""
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		repo, t, ok := strings.Cut(c.Image, ":")
		if !ok || repo != ImageRepo || (tag != "" && t != tag) {
			return "", false
		}
		tag = t
	}
	return tag, tag != ""
}

// imageBinDir is the directory whose binaries stand for weft's image at
// tag: the lab's own build for the dev tag, else Options.ImagesDir/<tag>.
func (k *Kubelet) imageBinDir(tag string) (string, error) {
	if tag == "dev" {
		return k.opts.BinDir, nil
	}
	dir := filepath.Join(k.opts.ImagesDir, tag)
	if _, err := os.Stat(filepath.Join(dir, "weft-agent")); err != nil {
		return "", fmt.Errorf("image %s:%s is not in the lab (%s)", ImageRepo, tag, dir)
	}
	return dir, nil
}

func (k *Kubelet) podDir(uid string) string { return filepath.Join(k.opts.StateDir, "pods", uid) }

// startImagePod wires the pod's network (unless it uses the node's),
// prepares its volumes, runs its init containers and starts its
// containers.
func (k *Kubelet) startImagePod(ctx context.Context, pod *corev1.Pod, tag string) (*podRun, error) {
	run := &podRun{UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name, Started: time.Now(),
		HostNetwork: pod.Spec.HostNetwork, Tag: tag}
	if pod.Spec.HostNetwork {
		run.IPs = []string{k.opts.NodeIP.String()}
	} else {
		var err error
		if run, err = k.wire(ctx, pod, run); err != nil || run == nil {
			return nil, err
		}
	}
	fail := func(err error) (*podRun, error) {
		k.stopContainers(run, 0)
		k.unwire(ctx, run)
		return nil, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	files, err := k.prepare(ctx, pod, run)
	if err != nil {
		return fail(err)
	}
	for _, c := range pod.Spec.InitContainers {
		spec, err := k.containerSpec(ctx, pod, run, files, c)
		if err != nil {
			return fail(err)
		}
		cr := &containerRun{Name: c.Name}
		if err := k.launch(run, cr, spec); err != nil {
			return fail(err)
		}
		if err := waitExit(ctx, cr.PID, 2*time.Minute); err != nil {
			return fail(fmt.Errorf("init container %s: %w (log %s)", c.Name, err, k.containerLog(run, c.Name)))
		}
	}
	for _, c := range pod.Spec.Containers {
		spec, err := k.containerSpec(ctx, pod, run, files, c)
		if err != nil {
			return fail(err)
		}
		cr := &containerRun{Name: c.Name}
		if err := k.launch(run, cr, spec); err != nil {
			return fail(err)
		}
		run.Containers = append(run.Containers, cr)
	}
	if err := k.save(run); err != nil {
		return fail(err)
	}
	k.opts.Log.Info("pod started", "pod", pod.Namespace+"/"+pod.Name, "image", ImageRepo+":"+tag, "ips", run.IPs)
	return run, nil
}

// waitExit waits for a child process of this kubelet to exit successfully.
func waitExit(ctx context.Context, pid int, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	proc, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() {
		st, err := proc.Wait()
		if err == nil && !st.Success() {
			err = errors.New(st.String())
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		_ = proc.Kill()
		return fmt.Errorf("still running after %s", limit)
	}
}

func (k *Kubelet) containerLog(run *podRun, name string) string {
	return filepath.Join(k.opts.StateDir, "logs", run.Namespace+"_"+run.Name+"_"+name+".log")
}

// launch starts the container shim for spec and records its pid in cr.
func (k *Kubelet) launch(run *podRun, cr *containerRun, spec ContainerSpec) error {
	dir := k.podDir(string(run.UID))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	specPath := filepath.Join(dir, cr.Name+".json")
	if err := fsutil.WriteFileAtomic(specPath, b, 0o600); err != nil {
		return err
	}
	logf, err := os.OpenFile(k.containerLog(run, cr.Name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(k.opts.Shim[0], append(slices.Clone(k.opts.Shim[1:]), "--spec", specPath)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Unshareflags: syscall.CLONE_NEWNS}
	start := cmd.Start
	if !run.HostNetwork {
		start = func() error { return netnsutil.Do(run.nsPath(), cmd.Start) }
	}
	if err := start(); err != nil {
		return fmt.Errorf("starting container %s: %w", cr.Name, err)
	}
	cr.PID, cr.Started, cr.Ready = cmd.Process.Pid, time.Now(), false
	_ = cmd.Process.Release()
	return nil
}

// containerSpec resolves what a container runs: the image's root with the
// tag's binaries bound over their paths, the pod's volumes, env, user and
// securityContext.
func (k *Kubelet) containerSpec(ctx context.Context, pod *corev1.Pod, run *podRun, files podFiles, c corev1.Container) (ContainerSpec, error) {
	field := func(f string) string { return fmt.Sprintf("container %s: %s", c.Name, f) }
	bin, err := k.imageBinDir(run.Tag)
	if err != nil {
		return ContainerSpec{}, err
	}
	spec := ContainerSpec{Root: k.opts.ImageRoot, Argv: slices.Concat(c.Command, c.Args), Dir: c.WorkingDir}
	if len(spec.Argv) == 0 {
		return spec, errors.New(field("command: empty (weft's image has no entrypoint)"))
	}
	for name, path := range image.Binaries {
		spec.Binds = append(spec.Binds, Bind{Source: filepath.Join(bin, name), Target: "/" + path, ReadOnly: true})
	}
	slices.SortFunc(spec.Binds, func(a, b Bind) int { return strings.Compare(a.Target, b.Target) })
	for _, m := range c.VolumeMounts {
		src, ok := files.volumes[m.Name]
		if !ok {
			return spec, fmt.Errorf("%s: no volume named %q", field("volumeMounts"), m.Name)
		}
		if m.SubPath != "" {
			src = filepath.Join(src, m.SubPath)
		}
		spec.Binds = append(spec.Binds, Bind{Source: src, Target: m.MountPath, ReadOnly: m.ReadOnly})
	}
	spec.Binds = append(spec.Binds, Bind{Source: files.resolvConf, Target: "/etc/resolv.conf", ReadOnly: true})
	if spec.Env, err = k.env(ctx, pod, run, c); err != nil {
		return spec, fmt.Errorf("%s: %w", field("env"), err)
	}
	spec.UID, spec.GID = runAs(pod, c)
	spec.Security, err = securityOf(c)
	return spec, err
}

// podFiles are what a pod's containers mount: its volumes by name and its
// resolv.conf.
type podFiles struct {
	volumes    map[string]string
	resolvConf string
}

// prepare makes the pod's files, once for all its containers (and again
// when a container restarts: tokens and ConfigMaps are read anew).
func (k *Kubelet) prepare(ctx context.Context, pod *corev1.Pod, run *podRun) (podFiles, error) {
	volumes, err := k.volumes(ctx, pod, run)
	if err != nil {
		return podFiles{}, err
	}
	resolv, err := k.resolvConf(pod, run)
	return podFiles{volumes: volumes, resolvConf: resolv}, err
}

// resolvConf writes the pod's /etc/resolv.conf as its dnsPolicy says: the
// cluster DNS (ClusterFirst, and ClusterFirstWithHostNet on the node's
// network) or the node's own resolvers (Default, and ClusterFirst on the
// node's network).
func (k *Kubelet) resolvConf(pod *corev1.Pod, run *podRun) (string, error) {
	policy := pod.Spec.DNSPolicy
	if policy == "" {
		policy = corev1.DNSClusterFirst
	}
	var b []byte
	switch {
	case policy == corev1.DNSClusterFirstWithHostNet || policy == corev1.DNSClusterFirst && !pod.Spec.HostNetwork:
		d := k.opts.ClusterDomain
		b = fmt.Appendf(nil, "nameserver %s\nsearch %s.svc.%s svc.%s %s\noptions ndots:5\n", k.opts.ClusterDNS, pod.Namespace, d, d, d)
	case policy == corev1.DNSNone:
		if cfg := pod.Spec.DNSConfig; cfg != nil {
			for _, ns := range cfg.Nameservers {
				b = fmt.Appendf(b, "nameserver %s\n", ns)
			}
			if len(cfg.Searches) > 0 {
				b = fmt.Appendf(b, "search %s\n", strings.Join(cfg.Searches, " "))
			}
		}
	default:
		var err error
		if b, err = os.ReadFile("/etc/resolv.conf"); err != nil && !errors.Is(err, os.ErrNotExist) {
			return "", err
		}
	}
	path := filepath.Join(k.podDir(string(run.UID)), "resolv.conf")
	return path, fsutil.WriteFileAtomic(path, b, 0o644)
}

func runAs(pod *corev1.Pod, c corev1.Container) (uid, gid *int64) {
	if psc := pod.Spec.SecurityContext; psc != nil {
		uid, gid = psc.RunAsUser, psc.RunAsGroup
	}
	if sc := c.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			uid = sc.RunAsUser
		}
		if sc.RunAsGroup != nil {
			gid = sc.RunAsGroup
		}
	}
	return uid, gid
}

// env is a container's environment as kubelet builds it: the service
// variables of the kubernetes Service, then envFrom, then env.
func (k *Kubelet) env(ctx context.Context, pod *corev1.Pod, run *podRun, c corev1.Container) ([]string, error) {
	host := pod.Name
	if pod.Spec.HostNetwork {
		host = k.opts.Node
	}
	vars := map[string]string{
		"PATH":                    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOSTNAME":                host,
		"KUBERNETES_SERVICE_HOST": k.opts.APIServiceHost, "KUBERNETES_SERVICE_PORT": "443",
	}
	var order []string
	set := func(name, value string) {
		if _, ok := vars[name]; !ok {
			order = append(order, name)
		}
		vars[name] = value
	}
	for i, from := range c.EnvFrom {
		ref := from.ConfigMapRef
		if ref == nil {
			return nil, fmt.Errorf("envFrom[%d]: only configMapRef is supported by the lab", i)
		}
		cm, err := k.client.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) && ref.Optional != nil && *ref.Optional {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("envFrom[%d]: %w", i, err)
		}
		for key, v := range cm.Data {
			set(from.Prefix+key, v)
		}
	}
	for i, e := range c.Env {
		v, err := k.envValue(ctx, pod, run, e)
		if err != nil {
			return nil, fmt.Errorf("env[%d] %s: %w", i, e.Name, err)
		}
		set(e.Name, v)
	}
	out := make([]string, 0, len(vars))
	for _, name := range []string{"PATH", "HOSTNAME", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"} {
		out = append(out, name+"="+vars[name])
		delete(vars, name)
	}
	for _, name := range order {
		if v, ok := vars[name]; ok {
			out = append(out, name+"="+v)
		}
	}
	return out, nil
}

func (k *Kubelet) envValue(ctx context.Context, pod *corev1.Pod, run *podRun, e corev1.EnvVar) (string, error) {
	switch from := e.ValueFrom; {
	case from == nil:
		return e.Value, nil
	case from.FieldRef != nil:
		return k.fieldValue(pod, run, from.FieldRef.FieldPath)
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		cm, err := k.client.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err == nil {
			if v, ok := cm.Data[ref.Key]; ok {
				return v, nil
			}
			err = fmt.Errorf("configmap %s has no key %s", ref.Name, ref.Key)
		}
		if ref.Optional != nil && *ref.Optional {
			return "", nil
		}
		return "", err
	}
	return "", errors.New("valueFrom: only fieldRef and configMapKeyRef are supported by the lab")
}

// fieldValue is the downward API.
func (k *Kubelet) fieldValue(pod *corev1.Pod, run *podRun, path string) (string, error) {
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP":
		return k.opts.NodeIP.String(), nil
	case "status.podIP":
		if len(run.IPs) > 0 {
			return run.IPs[0], nil
		}
		return "", nil
	case "status.podIPs":
		return strings.Join(run.IPs, ","), nil
	}
	if key, ok := strings.CutPrefix(path, "metadata.labels['"); ok {
		return pod.Labels[strings.TrimSuffix(key, "']")], nil
	}
	if key, ok := strings.CutPrefix(path, "metadata.annotations['"); ok {
		return pod.Annotations[strings.TrimSuffix(key, "']")], nil
	}
	return "", fmt.Errorf("fieldRef %s: not supported by the lab", path)
}

// volumes makes the pod's volumes and returns their sources by name.
func (k *Kubelet) volumes(ctx context.Context, pod *corev1.Pod, run *podRun) (map[string]string, error) {
	out := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		dir := filepath.Join(k.podDir(string(run.UID)), "volumes", v.Name)
		var err error
		switch {
		case v.HostPath != nil:
			out[v.Name], err = k.hostPath(v.HostPath)
		case v.EmptyDir != nil:
			out[v.Name], err = dir, os.MkdirAll(dir, 0o777)
		case v.ConfigMap != nil:
			out[v.Name], err = dir, k.configMapFiles(ctx, pod.Namespace, v.ConfigMap.Name, v.ConfigMap.Items, v.ConfigMap.Optional, dir)
		case v.Projected != nil:
			out[v.Name], err = dir, k.projected(ctx, pod, run, v.Projected, dir)
		default:
			err = errors.New("only hostPath, emptyDir, configMap and projected volumes are supported by the lab")
		}
		if err != nil {
			return nil, fmt.Errorf("volume %s: %w", v.Name, err)
		}
	}
	return out, nil
}

// hostPath maps a hostPath volume to the node's directory for it
// (Options.HostPaths): a lab node's pods never reach the machine's own
// files.
func (k *Kubelet) hostPath(h *corev1.HostPathVolumeSource) (string, error) {
	p, ok := k.nodePath(h.Path)
	if !ok {
		return "", fmt.Errorf("hostPath %s: not a path a lab node has (%v)", h.Path, slices.Sorted(maps.Keys(k.opts.HostPaths)))
	}
	typ := corev1.HostPathUnset
	if h.Type != nil {
		typ = *h.Type
	}
	switch typ {
	case corev1.HostPathDirectoryOrCreate:
		return p, os.MkdirAll(p, 0o755)
	case corev1.HostPathFileOrCreate:
		f, err := os.OpenFile(p, os.O_CREATE|os.O_RDONLY, 0o644)
		if err == nil {
			f.Close()
		}
		return p, err
	case corev1.HostPathUnset:
		return p, nil
	}
	_, err := os.Stat(p)
	return p, err
}

// nodePath maps a machine path to the node's own, if the node has it.
func (k *Kubelet) nodePath(path string) (string, bool) {
	p := filepath.Clean(path)
	for from, to := range k.opts.HostPaths {
		if rest, ok := strings.CutPrefix(p, from); ok && (rest == "" || rest[0] == '/') {
			return to + rest, true
		}
	}
	return "", false
}

func writeFiles(dir string, files map[string][]byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, data := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := fsutil.WriteFileAtomic(p, data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// configMapData returns a ConfigMap's keys (or the chosen items) as files.
func (k *Kubelet) configMapData(ctx context.Context, ns, name string, items []corev1.KeyToPath, optional *bool) (map[string][]byte, error) {
	cm, err := k.client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) && optional != nil && *optional {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{}
	if len(items) == 0 {
		for key, v := range cm.Data {
			files[key] = []byte(v)
		}
		return files, nil
	}
	for _, it := range items {
		v, ok := cm.Data[it.Key]
		if !ok {
			return nil, fmt.Errorf("configmap %s/%s has no key %s", ns, name, it.Key)
		}
		files[it.Path] = []byte(v)
	}
	return files, nil
}

func (k *Kubelet) configMapFiles(ctx context.Context, ns, name string, items []corev1.KeyToPath, optional *bool, dir string) error {
	files, err := k.configMapData(ctx, ns, name, items, optional)
	if err != nil {
		return err
	}
	return writeFiles(dir, files)
}

// token asks the API server for a token of the pod's service account,
// bound to the pod, as kubelet does for projected tokens.
func (k *Kubelet) token(ctx context.Context, pod *corev1.Pod, audience string, seconds *int64) ([]byte, error) {
	req := &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{
		ExpirationSeconds: seconds,
		BoundObjectRef:    &authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}
	if audience != "" {
		req.Spec.Audiences = []string{audience}
	}
	tr, err := k.client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, pod.Spec.ServiceAccountName, req, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token for service account %s/%s: %w", pod.Namespace, pod.Spec.ServiceAccountName, err)
	}
	return []byte(tr.Status.Token), nil
}

func (k *Kubelet) projected(ctx context.Context, pod *corev1.Pod, run *podRun, p *corev1.ProjectedVolumeSource, dir string) error {
	files := map[string][]byte{}
	for i, s := range p.Sources {
		switch {
		case s.ServiceAccountToken != nil:
			tok, err := k.token(ctx, pod, s.ServiceAccountToken.Audience, s.ServiceAccountToken.ExpirationSeconds)
			if err != nil {
				return err
			}
			files[s.ServiceAccountToken.Path] = tok
		case s.ConfigMap != nil:
			cm, err := k.configMapData(ctx, pod.Namespace, s.ConfigMap.Name, s.ConfigMap.Items, s.ConfigMap.Optional)
			if err != nil {
				return err
			}
			for name, b := range cm {
				files[name] = b
			}
		case s.DownwardAPI != nil:
			for _, it := range s.DownwardAPI.Items {
				if it.FieldRef == nil {
					return fmt.Errorf("sources[%d].downwardAPI %s: only fieldRef is supported by the lab", i, it.Path)
				}
				v, err := k.fieldValue(pod, run, it.FieldRef.FieldPath)
				if err != nil {
					return err
				}
				files[it.Path] = []byte(v)
			}
		default:
			return fmt.Errorf("sources[%d]: only serviceAccountToken, configMap and downwardAPI are supported by the lab", i)
		}
	}
	return writeFiles(dir, files)
}

// stopContainers sends SIGTERM to the pod's containers, waits up to grace
// for them to exit, then kills what is left.
func (k *Kubelet) stopContainers(run *podRun, grace time.Duration) {
	var pids []int
	for _, c := range run.Containers {
		if proc.Running(c.PID) {
			pids = append(pids, c.PID)
		}
	}
	proc.Stop(pids, grace)
}
