package lab

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// waitNodesReady waits until every node is registered, has a podCIDR, and
// its agent has cleared NetworkUnavailable.
func waitNodesReady(ctx context.Context, c kubernetes.Interface, nodes []Member) error {
	pending := map[string]string{}
	for {
		clear(pending)
		for _, m := range nodes {
			n, err := c.CoreV1().Nodes().Get(ctx, m.Name, metav1.GetOptions{})
			switch {
			case err != nil:
				pending[m.Name] = "not registered"
			case len(n.Spec.PodCIDRs) == 0:
				pending[m.Name] = "no podCIDR"
			case !networkReady(n):
				pending[m.Name] = "routes not programmed"
			}
		}
		if len(pending) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("nodes not ready %v (see the logs in the lab dir): %w", pending, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func networkReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeNetworkUnavailable {
			return c.Status == corev1.ConditionFalse
		}
	}
	return false
}
