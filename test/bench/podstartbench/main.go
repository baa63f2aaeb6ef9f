// Command podstartbench measures the lab as a user meets it: how long a
// 3-node lab takes to come up (lab up's own breakdown: control plane, each
// node's mount namespace and containerd, the image imports, weft's
// install), and pod start latency on its real nodes: a Deployment of
// -replicas pods of the lab workload is created, and each pod's start is
// the time from the Deployment's creation to the client seeing the pod
// Ready (polled every 50 ms), reported as median and maximum over -runs
// rounds.
//
// There is no upstream peer for this: it is weft's CNI plugin and agent on
// the upstream kubelet and containerd, reported in absolute numbers.
//
// Usage (root, repository root):
//
//	go run ./test/bench/podstartbench [-nodes 3] [-replicas 30] [-runs 3] [-proxy-mode iptables]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/weftnet/weft/lab"
	"github.com/weftnet/weft/test/bench/benchlab"
)

func main() {
	nodes := flag.Int("nodes", 3, "lab nodes")
	replicas := flag.Int("replicas", 30, "pods of the Deployment")
	runs := flag.Int("runs", 3, "rounds (a Deployment created, measured and deleted each)")
	mode := flag.String("proxy-mode", "iptables", "the agents' service proxy")
	flag.Parse()
	benchlab.Main("podstartbench", func(ctx context.Context) error { return run(ctx, *nodes, *replicas, *runs, *mode) })
}

func run(ctx context.Context, nodes, replicas, runs int, mode string) error {
	bin, err := filepath.Abs("bin")
	if err != nil {
		return err
	}
	done, err := lab.WaitTurn(ctx)
	if err != nil {
		return err
	}
	defer done()
	dir, err := os.MkdirTemp("", "podstartbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	dir = filepath.Join(dir, "lab")
	fmt.Printf("lab up, %d nodes, %s proxy:\n", nodes, mode)
	upCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	begin := time.Now()
	err = lab.Up(upCtx, lab.Options{Nodes: nodes, Routing: "hostgw", ProxyMode: mode, Dir: dir, BinDir: bin, APIPort: lab.APIServerPort, Out: os.Stdout})
	defer lab.Down(dir)
	if err != nil {
		return err
	}
	fmt.Printf("lab up took %.1fs\n\n", time.Since(begin).Seconds())
	c, err := lab.Client(lab.AdminKubeconfig(dir))
	if err != nil {
		return err
	}
	if err := lab.WaitServiceAccount(ctx, c, "default"); err != nil {
		return err
	}
	var all []time.Duration
	for r := range runs {
		lat, err := round(ctx, c, fmt.Sprintf("start-%d", r), replicas)
		if err != nil {
			return err
		}
		slices.Sort(lat)
		fmt.Printf("round %d: %d pods Ready, start median %v, max %v\n", r+1, len(lat), lat[len(lat)/2], lat[len(lat)-1])
		all = append(all, lat...)
	}
	slices.Sort(all)
	fmt.Printf("\npod start, %d pods over %d rounds of a %d-replica Deployment on %d nodes: median %v, max %v\n",
		len(all), runs, replicas, nodes, all[len(all)/2], all[len(all)-1])
	return nil
}

// round creates a Deployment, waits until all its pods are Ready, and
// returns each pod's time from the Deployment's creation to Ready; it
// deletes the Deployment and waits for its pods to be gone.
func round(ctx context.Context, c kubernetes.Interface, name string, replicas int) ([]time.Duration, error) {
	labels := map[string]string{"app": name}
	pod := lab.WorkloadPod("", "", labels)
	n := int32(replicas)
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: &n,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: pod.Spec},
		},
	}
	created := time.Now()
	if _, err := c.AppsV1().Deployments("default").Create(ctx, d, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	sel := metav1.ListOptions{LabelSelector: "app=" + name}
	ready := map[string]time.Duration{}
	for len(ready) < replicas {
		list, err := c.CoreV1().Pods("default").List(ctx, sel)
		if err != nil {
			return nil, err
		}
		for _, p := range list.Items {
			if _, seen := ready[p.Name]; !seen && podReady(&p) {
				ready[p.Name] = time.Since(created)
			}
		}
		if time.Since(created) > 5*time.Minute {
			return nil, fmt.Errorf("%s: %d of %d pods Ready after 5 minutes", name, len(ready), replicas)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var lat []time.Duration
	for _, l := range ready {
		lat = append(lat, l)
	}
	fg := metav1.DeletePropagationForeground
	if err := c.AppsV1().Deployments("default").Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &fg}); err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		list, err := c.CoreV1().Pods("default").List(ctx, sel)
		if err == nil && len(list.Items) == 0 {
			return lat, nil
		}
		if time.Now().After(deadline) {
			return nil, errors.New(name + ": pods not gone 3 minutes after the Deployment's deletion")
		}
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
