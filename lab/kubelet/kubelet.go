// Package kubelet is the lab's mini-kubelet: it registers its Node, runs the
// Pods bound to it as network namespaces wired by the node's CNI
// configuration (through libcni, as containerd does) with the lab workload
// inside, reports their IPs and readiness, and tears them down on deletion.
//
// Readiness can be flipped by tests: a pod annotated ReadyAnnotation="false"
// is reported not ready (its endpoints leave the EndpointSlices).
package kubelet

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"
)

// ReadyAnnotation, set to "false" on a pod, makes the kubelet report it not ready.
const ReadyAnnotation = "lab.weft.dev/ready"

// Options configure the kubelet of one lab node.
type Options struct {
	Node        string
	NodeIP      netip.Addr
	Kubeconfig  string
	StateDir    string // pods' state and logs
	NSPrefix    string // pod namespaces are NSPrefix + node + "-" + uid prefix
	CNIConfDir  string
	CNIBinDir   string
	WorkloadBin string
	Log         *slog.Logger

	// Pods of weft's image (imagepods.go).
	BinDir    string   // the lab's binaries: weft's image at tag "dev"
	ImagesDir string   // other tags: ImagesDir/<tag> holds their binaries
	ImageRoot string   // the image's unpacked root file system
	Shim      []string // the container shim's argv (ContainerShim), "--spec FILE" appended
	// APIServiceHost is the kubernetes Service's ClusterIP
	// (KUBERNETES_SERVICE_HOST in every container).
	APIServiceHost string
	// ClusterDNS and ClusterDomain make the resolv.conf of ClusterFirst
	// pods.
	ClusterDNS, ClusterDomain string
	// HostPaths map the machine paths a lab node has its own of (hostPath
	// volumes, paths in the CNI configuration) to the node's directories:
	// a lab node's file system is a directory, and nothing it runs
	// reaches the machine's own files through those paths.
	HostPaths map[string]string
	// Labels are added to the Node's at registration (kubelet
	// --node-labels).
	Labels map[string]string
}

// Kubelet runs one node's pods.
type Kubelet struct {
	opts   Options
	client kubernetes.Interface
	pods   cache.Indexer
	queue  workqueue.TypedRateLimitingInterface[string]

	mu      sync.Mutex
	running map[types.UID]*podRun // by pod UID
}

// Run registers the node and runs its pods until ctx ends.
func Run(ctx context.Context, o Options) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	for _, d := range []string{o.StateDir, filepath.Join(o.StateDir, "pods"), filepath.Join(o.StateDir, "logs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	k := &Kubelet{
		opts:    o,
		client:  client,
		queue:   workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		running: map[types.UID]*podRun{},
	}
	if err := k.registerNode(ctx); err != nil {
		return fmt.Errorf("registering node %s: %w", o.Node, err)
	}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
		lo.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", o.Node).String()
	}))
	inf := factory.Core().V1().Pods().Informer()
	k.pods = inf.GetIndexer()
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			k.queue.Add(key)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, n any) { enqueue(n) }, DeleteFunc: enqueue,
	}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return ctx.Err()
	}
	k.adopt()
	go every(ctx, 20*time.Second, func() { k.heartbeat(ctx) })
	go every(ctx, time.Second, k.retryPending)
	go k.monitor(ctx)
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Go(func() {
			for k.processNext(ctx) {
			}
		})
	}
	<-ctx.Done()
	k.queue.ShutDown()
	wg.Wait()
	return nil
}

func (k *Kubelet) processNext(ctx context.Context) bool {
	key, quit := k.queue.Get()
	if quit {
		return false
	}
	defer k.queue.Done(key)
	if err := k.sync(ctx, key); err != nil {
		k.opts.Log.Warn("syncing pod", "pod", key, "err", err)
		k.queue.AddRateLimited(key)
		return true
	}
	k.queue.Forget(key)
	return true
}

// retryPending re-queues pods still waiting (e.g. for the CNI config).
func (k *Kubelet) retryPending() {
	for _, obj := range k.pods.List() {
		pod := obj.(*corev1.Pod)
		if pod.Status.Phase == corev1.PodPending || pod.Status.Phase == "" {
			if key, err := cache.MetaNamespaceKeyFunc(pod); err == nil {
				k.queue.Add(key)
			}
		}
	}
}

// every runs fn each period until ctx ends.
func every(ctx context.Context, period time.Duration, fn func()) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}

func (k *Kubelet) registerNode(ctx context.Context) error {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: k.opts.Node, Labels: map[string]string{
			"kubernetes.io/hostname": k.opts.Node, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
		}},
	}
	maps.Copy(node.Labels, k.opts.Labels)
	_, err := k.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return k.updateNodeStatus(ctx)
}

func (k *Kubelet) updateNodeStatus(ctx context.Context) error {
	node, err := k.client.CoreV1().Nodes().Get(ctx, k.opts.Node, metav1.GetOptions{})
	if err != nil {
		return err
	}
	now := metav1.Now()
	node.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: k.opts.NodeIP.String()},
		{Type: corev1.NodeHostName, Address: k.opts.Node},
	}
	// The kubelet owns pods, cpu and memory; extended resources others
	// advertised on the node (weft's topology exporter) are kept.
	own := corev1.ResourceList{
		corev1.ResourcePods: resource.MustParse("110"), corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("4Gi"),
	}
	for _, list := range []*corev1.ResourceList{&node.Status.Capacity, &node.Status.Allocatable} {
		if *list == nil {
			*list = corev1.ResourceList{}
		}
		for name, q := range own {
			(*list)[name] = q
		}
	}
	node.Status.NodeInfo.KubeletVersion = "weft-lab"
	setCondition(&node.Status.Conditions, corev1.NodeCondition{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		Message: "weft lab kubelet is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now,
	})
	_, err = k.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
	return err
}

func setCondition(conds *[]corev1.NodeCondition, c corev1.NodeCondition) {
	for i := range *conds {
		if (*conds)[i].Type == c.Type {
			if (*conds)[i].Status == c.Status {
				c.LastTransitionTime = (*conds)[i].LastTransitionTime
			}
			(*conds)[i] = c
			return
		}
	}
	*conds = append(*conds, c)
}

func (k *Kubelet) heartbeat(ctx context.Context) {
	if err := k.updateNodeStatus(ctx); err != nil {
		k.opts.Log.Warn("node heartbeat", "node", k.opts.Node, "err", err)
	}
}
