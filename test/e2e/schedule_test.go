package e2e

import (
	"context"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/weftnet/weft/lab"
)

// scheduledDeployment is what a new user does first: a Deployment whose
// pods name no node (`kubectl create deployment spread --image=weft-workload:lab
// --replicas=6`) and a Service in front of it. kube-scheduler places the
// pods over every node, the kubelets run them, and the Service
// answers from clientNS with pods of every node.
func scheduledDeployment(t *testing.T, c *cluster, clientNS string) {
	t.Helper()
	ctx := context.Background()
	sel := map[string]string{"app": "spread"}
	replicas := int32(6)
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "spread"}, Spec: appsv1.DeploymentSpec{
		Replicas: &replicas, Selector: &metav1.LabelSelector{MatchLabels: sel},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: sel},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: lab.WorkloadImage}}}},
	}}
	if _, err := c.client.AppsV1().Deployments("default").Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "spread"}, Spec: corev1.ServiceSpec{
		Selector: sel, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(80)}}}}
	svc, err := c.client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	var podNode map[string]string
	for deadline := time.Now().Add(60 * time.Second); ; {
		list, err := c.client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(sel).String()})
		if err != nil {
			t.Fatal(err)
		}
		podNode = map[string]string{}
		for _, p := range list.Items {
			if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
				podNode[p.Name] = p.Spec.NodeName
			}
		}
		if len(podNode) == int(replicas) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d scheduled pods running: %v", len(podNode), replicas, podNode)
		}
		time.Sleep(200 * time.Millisecond)
	}
	nodes := map[string]int{}
	for _, n := range podNode {
		nodes[n]++
	}
	if len(nodes) != len(lab.NodeMembers(c.state.Members)) {
		t.Errorf("the scheduler placed the pods on %v, want them spread over every node", nodes)
	}

	c.waitEndpoints(t, "spread", int(replicas))
	answeredOn := map[string]bool{}
	for deadline := time.Now().Add(30 * time.Second); len(answeredOn) < len(nodes); {
		if time.Now().After(deadline) {
			t.Fatalf("the Service answered only from pods on %v", answeredOn)
		}
		if r, err := c.fetch(clientNS, "http://"+svc.Spec.ClusterIP+"/"); err == nil {
			answeredOn[podNode[r.Pod]] = true
		}
	}
}

// extendedResources: a kubelet admits pods against the extended resources
// its node advertises (here example.com/widget: 1), even for pods that
// name the node themselves and so skip the scheduler's check: the second
// pod asking for the only widget is failed with OutOfexample.com/widget.
func extendedResources(t *testing.T, c *cluster) {
	t.Helper()
	ctx := context.Background()
	patch := []byte(`{"status":{"capacity":{"example.com/widget":"1"},"allocatable":{"example.com/widget":"1"}}}`)
	if _, err := c.client.CoreV1().Nodes().PatchStatus(ctx, "node1", patch); err != nil {
		t.Fatal(err)
	}
	widgetPod := func(name string) {
		one := resource.MustParse("1")
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{NodeName: "node1",
			Containers: []corev1.Container{{Name: "w", Image: lab.WorkloadImage, Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{"example.com/widget": one}, Limits: corev1.ResourceList{"example.com/widget": one}}}}}}
		if _, err := c.client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	widgetPod("widget-1")
	waitRunning(t, c, "default", "widget-1")
	widgetPod("widget-2")
	for deadline := time.Now().Add(30 * time.Second); ; {
		p, err := c.client.CoreV1().Pods("default").Get(ctx, "widget-2", metav1.GetOptions{})
		if err == nil && p.Status.Phase == corev1.PodFailed {
			if p.Status.Reason != "OutOfexample.com/widget" {
				t.Fatalf("widget-2 failed with %q (%s), want OutOfexample.com/widget", p.Status.Reason, p.Status.Message)
			}
			break
		}
		if err == nil && p.Status.Phase == corev1.PodRunning {
			t.Fatal("widget-2 runs: the kubelet admitted a second pod for the node's only widget")
		}
		if time.Now().After(deadline) {
			t.Fatalf("widget-2 not rejected: %v %+v", err, p.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
