package kube

import (
	"context"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	cnpclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"
)

// ClusterPolicyCondition is the condition weft writes on each
// ClusterNetworkPolicy: True when weft enforces it as written, False
// (reason PartlyFailedClosed) naming what it enforces otherwise.
const ClusterPolicyCondition = "weft.dev/Enforced"

// maxConditionMessage bounds the condition's message (the API allows
// 32768 bytes).
const maxConditionMessage = 4096

// ClusterPolicyStatus writes ClusterPolicyCondition.
type ClusterPolicyStatus struct {
	Client cnpclient.Interface
	// Leading, when set, says whether this agent is the one that writes
	// (StatusLeader); while it is not, Report writes nothing.
	Leading func() bool
}

// Report sets p's condition for problems (none: enforced as written)
// unless it already says so. done is false when this agent is not the
// writer now, or when the write lost a race with another writer: the
// caller tries again later, with the newer object.
func (s ClusterPolicyStatus) Report(ctx context.Context, p *cnpv1beta1.ClusterNetworkPolicy, problems []string) (done bool, err error) {
	if s.Leading != nil && !s.Leading() {
		return false, nil
	}
	want := metav1.Condition{Type: ClusterPolicyCondition, Status: metav1.ConditionTrue, Reason: "Enforced",
		Message: "enforced as written", ObservedGeneration: p.Generation}
	if len(problems) > 0 {
		msg := "enforced failing closed where it cannot be read as written: " + strings.Join(problems, "; ")
		if len(msg) > maxConditionMessage {
			msg = msg[:maxConditionMessage-3] + "..."
		}
		want.Status, want.Reason, want.Message = metav1.ConditionFalse, "PartlyFailedClosed", msg
	}
	if cur := meta.FindStatusCondition(p.Status.Conditions, ClusterPolicyCondition); cur != nil &&
		cur.Status == want.Status && cur.Reason == want.Reason && cur.Message == want.Message && cur.ObservedGeneration == want.ObservedGeneration {
		return true, nil
	}
	next := p.DeepCopy()
	meta.SetStatusCondition(&next.Status.Conditions, want)
	_, err = s.Client.PolicyV1beta1().ClusterNetworkPolicies().UpdateStatus(ctx, next, metav1.UpdateOptions{})
	switch {
	case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("clusternetworkpolicy %s: writing its status: %w", p.Name, err)
	}
	return true, nil
}
