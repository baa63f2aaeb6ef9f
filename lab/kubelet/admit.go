package kubelet

import (
	"context"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The mini-kubelet runs every pod the lab workload, whatever it asks for,
// but it admits pods the way a kubelet does for the resources it can
// check: extended resources (a name with a domain outside kubernetes.io,
// such as weft.dev/pod-ips), which anyone may advertise on a Node. A pod
// whose requests do not fit next to the pods already running is failed
// with reason OutOf<resource> and never started, as kubelet does when a
// pod reaches a node the scheduler's view did not match.

// extendedResource reports whether name is an extended resource.
func extendedResource(name corev1.ResourceName) bool {
	domain, _, ok := strings.Cut(string(name), "/")
	return ok && domain != "kubernetes.io" && !strings.HasSuffix(domain, ".kubernetes.io") &&
		!strings.HasPrefix(string(name), corev1.ResourceHugePagesPrefix) && !strings.HasPrefix(string(name), "requests.")
}

// extendedRequests sums a pod's extended resource requests (limits stand
// for requests where only they are set, as the API server defaults them).
func extendedRequests(pod *corev1.Pod) corev1.ResourceList {
	out := corev1.ResourceList{}
	for _, c := range pod.Spec.Containers {
		for name, q := range c.Resources.Requests {
			if extendedResource(name) {
				sum := out[name]
				sum.Add(q)
				out[name] = sum
			}
		}
		for name, q := range c.Resources.Limits {
			if _, set := c.Resources.Requests[name]; !set && extendedResource(name) {
				sum := out[name]
				sum.Add(q)
				out[name] = sum
			}
		}
	}
	return out
}

// misfit says which extended resource pod does not get on a node with
// allocatable, given the pods already admitted there; "" when it fits.
func misfit(pod *corev1.Pod, admitted []*corev1.Pod, allocatable corev1.ResourceList) (corev1.ResourceName, string) {
	want := extendedRequests(pod)
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, string(n))
	}
	sort.Strings(names)
	for _, n := range names {
		name := corev1.ResourceName(n)
		var used resource.Quantity
		for _, p := range admitted {
			if q, ok := extendedRequests(p)[name]; ok {
				used.Add(q)
			}
		}
		requested := want[name]
		total := used.DeepCopy()
		total.Add(requested)
		capacity := allocatable[name]
		if total.Cmp(capacity) > 0 {
			return name, fmt.Sprintf("Node didn't have enough resource: %s, requested: %s, used: %s, capacity: %s",
				name, requested.String(), used.String(), capacity.String())
		}
	}
	return "", ""
}

// admit checks pod against the node's allocatable extended resources and
// the pods this kubelet runs; a misfit fails the pod.
func (k *Kubelet) admit(ctx context.Context, pod *corev1.Pod) (bool, error) {
	if len(extendedRequests(pod)) == 0 {
		return true, nil
	}
	node, err := k.client.CoreV1().Nodes().Get(ctx, k.opts.Node, metav1.GetOptions{})
	if err != nil {
		return false, err
	}
	var admitted []*corev1.Pod
	for _, r := range k.runs() {
		if r.UID == pod.UID {
			continue
		}
		if obj, ok, _ := k.pods.GetByKey(r.Namespace + "/" + r.Name); ok {
			admitted = append(admitted, obj.(*corev1.Pod))
		}
	}
	name, msg := misfit(pod, admitted, node.Status.Allocatable)
	if name == "" {
		return true, nil
	}
	p := pod.DeepCopy()
	p.Status = corev1.PodStatus{Phase: corev1.PodFailed, Reason: "OutOf" + string(name), Message: msg}
	if _, err := k.client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		return false, err
	}
	k.opts.Log.Info("pod rejected", "pod", pod.Namespace+"/"+pod.Name, "reason", p.Status.Reason, "message", msg)
	return false, nil
}
