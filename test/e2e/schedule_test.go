package e2e

import (
	"context"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/weftnet/weft/lab"
)

// scheduledDeployment is what a new user does first: a Deployment whose
// pods name no node (`kubectl create deployment spread --image=anything
// --replicas=6`) and a Service in front of it. kube-scheduler places the
// pods over every node, the mini-kubelets run them, and the Service
// answers from clientNS with pods of every node.
func scheduledDeployment(t *testing.T, c *cluster, clientNS string) {
	t.Helper()
	ctx := context.Background()
	sel := map[string]string{"app": "spread"}
	replicas := int32(6)
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "spread"}, Spec: appsv1.DeploymentSpec{
		Replicas: &replicas, Selector: &metav1.LabelSelector{MatchLabels: sel},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: sel},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "anything"}}}},
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

	podNode := map[string]string{}
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
	for deadline := time.Now().Add(20 * time.Second); len(answeredOn) < len(nodes); {
		if r, err := c.fetch(clientNS, "http://"+svc.Spec.ClusterIP+"/"); err == nil {
			answeredOn[podNode[r.Pod]] = true
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Service answered only from pods on %v", answeredOn)
		}
	}
}
