package lab

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/weftnet/weft/internal/image"
	"github.com/weftnet/weft/lab/workload"
)

// WorkloadImage is the lab workload's image (weft-workload: HTTP on :80,
// TCP and UDP echo on :81), imported on every node.
const WorkloadImage = image.WorkloadImage

// WorkloadPod is a pod of the lab workload named name on node ("": the
// scheduler's pick), its HTTP port named "http", ready while GET /ready
// says so (SetReady).
func WorkloadPod(name, node string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{
			Name: "workload", Image: WorkloadImage,
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 80}},
			ReadinessProbe: &corev1.Probe{
				ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromInt32(80)}},
				PeriodSeconds: 1, FailureThreshold: 1,
			},
		}}},
	}
}

// SetReady turns a running workload pod's readiness as its application
// would: the kubelet's readiness probe sees it on its next period.
func (st *State) SetReady(ctx context.Context, p *corev1.Pod, ready bool) error {
	for _, n := range NodeMembers(st.Members) {
		if n.Name == p.Spec.NodeName {
			addr := netip.MustParseAddr(p.Status.PodIP)
			return workload.SetReadyVia(ctx, st.Dialer(n.NSPath()), "http://"+netip.AddrPortFrom(addr, 80).String(), ready)
		}
	}
	return fmt.Errorf("pod %s/%s is on no lab node", p.Namespace, p.Name)
}

// AgentPID is the pid of the weft-agent container on node: the weft-agent
// process among the node's containers (the processes in its kubelet's
// cgroup root).
func AgentPID(node string) (int, bool) {
	return findProcess(func(pid int, cgroup string) bool {
		if !inNodeCgroup(cgroup, node) {
			return false
		}
		cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		return err == nil && filepath.Base(strings.SplitN(string(cmd), "\x00", 2)[0]) == "weft-agent"
	})
}

// AgentLog is the newest log of the weft-agent container on node.
func AgentLog(dir, node string) string {
	files, _ := filepath.Glob(filepath.Join(NodeRoot(dir, node), "var/log/pods", "weft-system_weft-agent-*", "agent", "*.log"))
	var newest string
	var at time.Time
	for _, f := range files {
		if st, err := os.Stat(f); err == nil && st.ModTime().After(at) {
			newest, at = f, st.ModTime()
		}
	}
	return newest
}

// PodLogs lists the logs of every container of the lab's pods in
// namespace ns, on every node.
func PodLogs(dir, ns string) []string {
	logs, _ := filepath.Glob(filepath.Join(dir, "nodes", "*", "root", "var/log/pods", ns+"_*", "*", "*.log"))
	return logs
}

// TagWeftImage gives weft's image (the dev tag) another tag on every node,
// as a new build pushed under a new tag would arrive: an upgrade test rolls
// the DaemonSet to it.
func (st *State) TagWeftImage(ctx context.Context, tag string) error {
	for _, n := range NodeMembers(st.Members) {
		if out, err := st.ctr(ctx, n.Name, "images", "tag", "--force", WeftImage+":dev", WeftImage+":"+tag).CombinedOutput(); err != nil {
			return fmt.Errorf("node %s: tagging %s:%s: %w: %s", n.Name, WeftImage, tag, err, out)
		}
	}
	return nil
}
