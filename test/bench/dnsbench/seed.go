package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/weftnet/weft/test/bench/benchlab"
)

const (
	benchNS = "dnsbench"
	zone    = "cluster.local"
)

func svcName(i int) string { return fmt.Sprintf("svc-%05d", i) }

func fqdn(i int) string { return svcName(i) + "." + benchNS + ".svc." + zone + "." }

// seed creates n selector-less ClusterIP Services with one named port.
func seed(ctx context.Context, c kubernetes.Interface, n int) error {
	if err := benchlab.EnsureNamespace(ctx, c, benchNS); err != nil {
		return err
	}
	return benchlab.Parallel(ctx, 0, n, func(i int) error {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: svcName(i)}, Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}},
		}}
		if _, err := c.CoreV1().Services(benchNS).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("seeding %s: %w", svcName(i), err)
		}
		return nil
	})
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
