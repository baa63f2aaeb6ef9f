package kubelet

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func podRequesting(res map[string]string, limitsOnly bool) *corev1.Pod {
	list := corev1.ResourceList{}
	for n, q := range res {
		list[corev1.ResourceName(n)] = resource.MustParse(q)
	}
	r := corev1.ResourceRequirements{Requests: list}
	if limitsOnly {
		r = corev1.ResourceRequirements{Limits: list}
	}
	return &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: r}}}}
}

func TestMisfit(t *testing.T) {
	alloc := corev1.ResourceList{"weft.dev/bandwidth": resource.MustParse("100"), "weft.dev/pod-ips": resource.MustParse("2")}
	for _, c := range []struct {
		name     string
		pod      *corev1.Pod
		admitted []*corev1.Pod
		want     string
	}{
		{"nothing extended", podRequesting(map[string]string{"cpu": "64", "memory": "1Ti"}, false), nil, ""},
		{"fits", podRequesting(map[string]string{"weft.dev/bandwidth": "60"}, false), nil, ""},
		{"fits next to another", podRequesting(map[string]string{"weft.dev/bandwidth": "40"}, false),
			[]*corev1.Pod{podRequesting(map[string]string{"weft.dev/bandwidth": "60"}, false)}, ""},
		{"too much next to another", podRequesting(map[string]string{"weft.dev/bandwidth": "41"}, false),
			[]*corev1.Pod{podRequesting(map[string]string{"weft.dev/bandwidth": "60"}, false)}, "weft.dev/bandwidth"},
		{"limits stand for requests", podRequesting(map[string]string{"weft.dev/pod-ips": "3"}, true), nil, "weft.dev/pod-ips"},
		{"not advertised at all", podRequesting(map[string]string{"example.com/gpu": "1"}, false), nil, "example.com/gpu"},
		{"kubernetes.io names are not extended", podRequesting(map[string]string{"kubernetes.io/whatever": "5"}, false), nil, ""},
	} {
		name, msg := misfit(c.pod, c.admitted, alloc)
		if string(name) != c.want {
			t.Errorf("%s: misfit %q (%s), want %q", c.name, name, msg, c.want)
		}
		if name != "" && !strings.Contains(msg, string(name)) {
			t.Errorf("%s: message %q does not name the resource", c.name, msg)
		}
	}
}
