package kubelet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/weftnet/weft/internal/fsutil"
	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/internal/proc"
)

// cniNetwork is the network name the agent's conflist carries.
const cniNetwork = "weft"

// podRun is a running pod, persisted so that a restarted kubelet adopts it.
type podRun struct {
	UID       types.UID `json:"uid"`
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	NetNS     string    `json:"netns"` // namespace name under netnsutil.RunDir
	PID       int       `json:"pid"`
	IPs       []string  `json:"ips"`
	Started   time.Time `json:"started"`
	// Image pods (imagepods.go): the tag of weft's image they run, and
	// their containers; HostNetwork pods run in the node's namespace.
	Tag         string          `json:"tag,omitempty"`
	HostNetwork bool            `json:"hostNetwork,omitempty"`
	Containers  []*containerRun `json:"containers,omitempty"`
}

func (r *podRun) container(name string) *containerRun {
	for _, c := range r.Containers {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// PodNetNS is the name of a pod's network namespace under netnsutil.RunDir.
func PodNetNS(prefix, node string, uid types.UID) string {
	return fmt.Sprintf("%s%s-%s", prefix, node, string(uid)[:8])
}

func (r *podRun) nsPath() string { return netnsutil.RunDir + "/" + r.NetNS }

func (k *Kubelet) statePath(uid types.UID) string {
	return filepath.Join(k.opts.StateDir, "pods", string(uid)+".json")
}

func (k *Kubelet) sync(ctx context.Context, key string) error {
	obj, exists, err := k.pods.GetByKey(key)
	if err != nil {
		return err
	}
	if !exists {
		// Deleted from the API (force delete): tear down whatever ran under that name.
		ns, name, _ := cache.SplitMetaNamespaceKey(key)
		for _, r := range k.runs() {
			if r.Namespace == ns && r.Name == name {
				if err := k.teardown(ctx, r); err != nil {
					return err
				}
			}
		}
		return nil
	}
	pod := obj.(*corev1.Pod)
	k.mu.Lock()
	run := k.running[pod.UID]
	k.mu.Unlock()
	if pod.DeletionTimestamp != nil {
		if run != nil {
			grace := 30 * time.Second
			if pod.DeletionGracePeriodSeconds != nil {
				grace = time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
			}
			k.stopContainers(run, grace)
			if err := k.teardown(ctx, run); err != nil {
				return err
			}
		}
		zero := int64(0)
		err := k.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &pod.UID},
		})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		return err
	}
	if run == nil {
		if pod.Status.Phase == corev1.PodFailed {
			return nil // rejected at admission
		}
		if ok, err := k.admit(ctx, pod); !ok || err != nil {
			return err
		}
		if tag, ok := imageTag(pod); ok {
			run, err = k.startImagePod(ctx, pod, tag)
		} else {
			run, err = k.start(ctx, pod)
		}
		if err != nil || run == nil {
			return err
		}
	}
	return k.updatePodStatus(ctx, pod, run)
}

func (k *Kubelet) runs() []*podRun {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]*podRun, 0, len(k.running))
	for _, r := range k.running {
		out = append(out, r)
	}
	return out
}

// cni returns the runtime side of CNI and the node's network list, or nil
// while the agent has not written the configuration yet.
func (k *Kubelet) cni() (*libcni.CNIConfig, *libcni.NetworkConfigList, error) {
	list, err := libcni.LoadNetworkConf(k.opts.CNIConfDir, cniNetwork)
	if err != nil {
		var notFound libcni.NotFoundError
		var none libcni.NoConfigsFoundError
		if errors.As(err, &notFound) || errors.As(err, &none) {
			return nil, nil, nil
		}
		return nil, nil, err
	}
	if len(k.opts.HostPaths) > 0 {
		// The agent wrote machine paths (the IPAM state's directory);
		// on a lab node they are the node's own.
		var doc any
		if err := json.Unmarshal(list.Bytes, &doc); err != nil {
			return nil, nil, err
		}
		b, err := json.Marshal(k.mapPaths(doc))
		if err != nil {
			return nil, nil, err
		}
		if list, err = libcni.ConfListFromBytes(b); err != nil {
			return nil, nil, err
		}
	}
	rt := libcni.NewCNIConfigWithCacheDir([]string{k.opts.CNIBinDir}, filepath.Join(k.opts.StateDir, "cni-cache"), nil)
	return rt, list, nil
}

// mapPaths replaces, in a decoded JSON document, every string that is a
// machine path the node has its own of with the node's path.
func (k *Kubelet) mapPaths(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for key, e := range x {
			x[key] = k.mapPaths(e)
		}
	case []any:
		for i, e := range x {
			x[i] = k.mapPaths(e)
		}
	case string:
		if p, ok := k.nodePath(x); ok && strings.HasPrefix(x, "/") {
			return p
		}
	}
	return v
}

func runtimeConf(r *podRun) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: string(r.UID), NetNS: r.nsPath(), IfName: "eth0",
		Args: [][2]string{{"K8S_POD_NAMESPACE", r.Namespace}, {"K8S_POD_NAME", r.Name}}}
}

// start wires a pod's network and starts the lab workload in it. It
// returns nil, nil while the node's CNI configuration is not written yet.
func (k *Kubelet) start(ctx context.Context, pod *corev1.Pod) (*podRun, error) {
	run := &podRun{UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name, Started: time.Now()}
	run, err := k.wire(ctx, pod, run)
	if err != nil || run == nil {
		return nil, err
	}
	if err := k.startWorkload(pod, run); err != nil {
		k.unwire(ctx, run)
		return nil, err
	}
	if err := k.save(run); err != nil {
		return nil, err
	}
	k.opts.Log.Info("pod started", "pod", pod.Namespace+"/"+pod.Name, "ips", run.IPs, "netns", run.NetNS)
	return run, nil
}

// wire makes the pod's network namespace and runs CNI ADD in it. It
// returns nil, nil while the node's CNI configuration is not written yet.
func (k *Kubelet) wire(ctx context.Context, pod *corev1.Pod, run *podRun) (*podRun, error) {
	rt, list, err := k.cni()
	if err != nil || list == nil {
		return nil, err
	}
	run.NetNS = PodNetNS(k.opts.NSPrefix, k.opts.Node, pod.UID)
	if _, err := netnsutil.NewNamed(run.NetNS); err != nil {
		return nil, err
	}
	res, err := rt.AddNetworkList(ctx, list, runtimeConf(run))
	if err != nil {
		_ = netnsutil.Delete(run.NetNS)
		return nil, fmt.Errorf("CNI ADD: %w", err)
	}
	result, err := current.GetResult(res)
	if err != nil {
		k.unwire(ctx, run)
		return nil, err
	}
	for _, ip := range result.IPs {
		run.IPs = append(run.IPs, ip.Address.IP.String())
	}
	return run, nil
}

// unwire undoes wire after a failed start.
func (k *Kubelet) unwire(ctx context.Context, run *podRun) {
	if run.HostNetwork || run.NetNS == "" {
		return
	}
	if rt, list, err := k.cni(); err == nil && list != nil {
		_ = rt.DelNetworkList(ctx, list, runtimeConf(run))
	}
	_ = netnsutil.Delete(run.NetNS)
}

// startWorkload runs the lab workload in the pod's namespace, detached so
// that it survives a kubelet restart, and waits until it listens.
func (k *Kubelet) startWorkload(pod *corev1.Pod, run *podRun) error {
	args := []string{"--name", pod.Name}
	if len(pod.Spec.Containers) > 0 && len(pod.Spec.Containers[0].Args) > 0 {
		args = append(args, pod.Spec.Containers[0].Args...)
	}
	ready := filepath.Join(k.opts.StateDir, "pods", string(pod.UID)+".ready")
	_ = os.Remove(ready)
	args = append(args, "--ready-file", ready)
	logf, err := os.OpenFile(filepath.Join(k.opts.StateDir, "logs", pod.Namespace+"_"+pod.Name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(k.opts.WorkloadBin, args...)
	cmd.Env = []string{"POD_NAME=" + pod.Name, "POD_NAMESPACE=" + pod.Namespace}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := netnsutil.Do(run.nsPath(), cmd.Start); err != nil {
		return fmt.Errorf("starting workload: %w", err)
	}
	run.PID = cmd.Process.Pid
	go func() { _ = cmd.Wait() }() // reap it while this kubelet lives
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(ready); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			return fmt.Errorf("workload of %s/%s did not listen within 10s", pod.Namespace, pod.Name)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// teardown stops a pod's workload, runs CNI DEL and removes its namespace.
func (k *Kubelet) teardown(ctx context.Context, r *podRun) error {
	if r.PID > 0 {
		_ = syscall.Kill(r.PID, syscall.SIGKILL)
	}
	k.stopContainers(r, 0)
	if !r.HostNetwork {
		rt, list, err := k.cni()
		if err != nil {
			return err
		}
		if list != nil {
			if err := rt.DelNetworkList(ctx, list, runtimeConf(r)); err != nil {
				return fmt.Errorf("CNI DEL for %s/%s: %w", r.Namespace, r.Name, err)
			}
		}
		if err := netnsutil.Delete(r.NetNS); err != nil {
			return err
		}
	}
	_ = os.Remove(k.statePath(r.UID))
	_ = os.RemoveAll(k.podDir(string(r.UID)))
	k.mu.Lock()
	delete(k.running, r.UID)
	k.mu.Unlock()
	k.opts.Log.Info("pod stopped", "pod", r.Namespace+"/"+r.Name)
	return nil
}

func (k *Kubelet) save(r *podRun) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.saveLocked(r)
}

// saveLocked is save with k.mu held.
func (k *Kubelet) saveLocked(r *podRun) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := fsutil.WriteFileAtomic(k.statePath(r.UID), b, 0o644); err != nil {
		return err
	}
	k.running[r.UID] = r
	return nil
}

// adopt loads the pods a previous kubelet process started; the informer
// then keeps those still bound here and tears down the others.
func (k *Kubelet) adopt() {
	files, _ := filepath.Glob(filepath.Join(k.opts.StateDir, "pods", "*.json"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var r podRun
		if json.Unmarshal(b, &r) != nil {
			continue
		}
		k.mu.Lock()
		k.running[r.UID] = &r
		k.mu.Unlock()
		k.queue.Add(r.Namespace + "/" + r.Name)
	}
}

func (k *Kubelet) updatePodStatus(ctx context.Context, pod *corev1.Pod, r *podRun) error {
	k.mu.Lock()
	want := podStatus(pod, r, k.opts.NodeIP.String())
	k.mu.Unlock()
	if statusEqual(pod.Status, want) {
		return nil
	}
	p := pod.DeepCopy()
	p.Status = want
	_, err := k.client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
	return err
}

func podStatus(pod *corev1.Pod, r *podRun, hostIP string) corev1.PodStatus {
	ready := pod.Annotations[ReadyAnnotation] != "false"
	for _, c := range r.Containers {
		ready = ready && c.Ready
	}
	started := metav1.NewTime(r.Started.Truncate(time.Second))
	cond := func(t corev1.PodConditionType, ok bool) corev1.PodCondition {
		s := corev1.ConditionTrue
		if !ok {
			s = corev1.ConditionFalse
		}
		// Keep the transition time when the status did not change.
		for _, c := range pod.Status.Conditions {
			if c.Type == t && c.Status == s {
				return c
			}
		}
		return corev1.PodCondition{Type: t, Status: s, LastTransitionTime: metav1.Now()}
	}
	st := corev1.PodStatus{
		Phase:     corev1.PodRunning,
		HostIP:    hostIP,
		HostIPs:   []corev1.HostIP{{IP: hostIP}},
		StartTime: &started,
		Conditions: []corev1.PodCondition{
			cond(corev1.PodScheduled, true), cond(corev1.PodInitialized, true),
			cond(corev1.ContainersReady, ready), cond(corev1.PodReady, ready),
		},
	}
	for _, ip := range r.IPs {
		st.PodIPs = append(st.PodIPs, corev1.PodIP{IP: ip})
	}
	if len(r.IPs) > 0 {
		st.PodIP = r.IPs[0]
	}
	for _, c := range pod.Spec.Containers {
		cs := corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: "lab://weft-workload", ContainerID: "lab://" + strconv.Itoa(r.PID),
			Ready: ready, Started: &ready, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}},
		}
		if cr := r.container(c.Name); cr != nil {
			live := proc.Running(cr.PID)
			cs.ImageID, cs.ContainerID = "lab://"+r.Tag, "lab://"+strconv.Itoa(cr.PID)
			cs.Ready, cs.Started, cs.RestartCount = cr.Ready && live, &live, cr.Restarts
			cs.State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(cr.Started.Truncate(time.Second))}}
			if !live {
				cs.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: cr.LastExit}}
			}
		}
		st.ContainerStatuses = append(st.ContainerStatuses, cs)
	}
	return st
}

// statusEqual compares what the kubelet owns, ignoring timestamps' wobble.
func statusEqual(a, b corev1.PodStatus) bool {
	if a.Phase != b.Phase || a.PodIP != b.PodIP || len(a.PodIPs) != len(b.PodIPs) || len(a.Conditions) != len(b.Conditions) {
		return false
	}
	for i := range a.Conditions {
		if a.Conditions[i].Type != b.Conditions[i].Type || a.Conditions[i].Status != b.Conditions[i].Status {
			return false
		}
	}
	if len(a.ContainerStatuses) != len(b.ContainerStatuses) {
		return false
	}
	for i := range a.ContainerStatuses {
		x, y := a.ContainerStatuses[i], b.ContainerStatuses[i]
		if x.Ready != y.Ready || x.RestartCount != y.RestartCount || x.ContainerID != y.ContainerID {
			return false
		}
	}
	return true
}
