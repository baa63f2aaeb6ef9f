package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

const (
	benchNS     = "dnsbench"
	seedWorkers = 32
	zone        = "cluster.local"
)

func svcName(i int) string { return fmt.Sprintf("svc-%05d", i) }

func fqdn(i int) string { return svcName(i) + "." + benchNS + ".svc." + zone + "." }

// seed creates n selector-less ClusterIP Services with one named port.
func seed(ctx context.Context, c kubernetes.Interface, n int) error {
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: benchNS}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	var next atomic.Int64
	errs := make(chan error, seedWorkers)
	var wg sync.WaitGroup
	for range seedWorkers {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: svcName(i)}, Spec: corev1.ServiceSpec{
					Type: corev1.ServiceTypeClusterIP, Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}},
				}}
				if _, err := c.CoreV1().Services(benchNS).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
					errs <- fmt.Errorf("seeding %s: %w", svcName(i), err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	return ctx.Err()
}

// writeQueries writes a dnsperf input of every Service's A record, in a
// fixed random order.
func writeQueries(path string, n int) error {
	r := rand.New(rand.NewPCG(1, 2))
	var b strings.Builder
	for _, i := range r.Perm(n) {
		fmt.Fprintf(&b, "%s A\n", fqdn(i))
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
