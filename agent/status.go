package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/weftnet/weft/routing"
)

// publishVTEPMAC puts the node's VTEP MAC on its Node object, so that the
// other nodes can program their neighbour and FDB entries.
func (a *Agent) publishVTEPMAC(ctx context.Context, self *corev1.Node) error {
	mac := routing.VTEPMAC(a.opts.NodeName).String()
	if strings.EqualFold(self.Annotations[VTEPMACAnnotation], mac) {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{VTEPMACAnnotation: mac}}})
	if err != nil {
		return err
	}
	if _, err := a.client.CoreV1().Nodes().Patch(ctx, a.opts.NodeName, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("publishing the VTEP MAC on node %s: %w", a.opts.NodeName, err)
	}
	return nil
}

// clearNetworkUnavailable sets the NetworkUnavailable condition to False,
// telling the scheduler that this node's pod network is in place.
func (a *Agent) clearNetworkUnavailable(ctx context.Context) error {
	now := metav1.Now()
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{{
		Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionFalse, Reason: "WeftRoutesCreated",
		Message: "weft-agent programmed the routes to the other nodes", LastTransitionTime: now, LastHeartbeatTime: now,
	}}}})
	if err != nil {
		return err
	}
	if _, err := a.client.CoreV1().Nodes().PatchStatus(ctx, a.opts.NodeName, patch); err != nil {
		return fmt.Errorf("clearing NetworkUnavailable on node %s: %w", a.opts.NodeName, err)
	}
	return nil
}
