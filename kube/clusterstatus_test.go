package kube

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	cnpfake "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned/fake"
)

// TestClusterPolicyStatus: the condition says enforced, or what fails
// closed; an unchanged one is not written again.
func TestClusterPolicyStatus(t *testing.T) {
	p := &cnpv1beta1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", Generation: 2}}
	c := cnpfake.NewSimpleClientset(p) // the field-managed tracker lacks this type's schema
	s := ClusterPolicyStatus{Client: c}
	ctx := context.Background()
	get := func() *cnpv1beta1.ClusterNetworkPolicy {
		got, err := c.PolicyV1beta1().ClusterNetworkPolicies().Get(ctx, "p", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if done, err := s.Report(ctx, p, nil); !done || err != nil {
		t.Fatalf("report: %v %v", done, err)
	}
	cond := meta.FindStatusCondition(get().Status.Conditions, ClusterPolicyCondition)
	if cond == nil || cond.Status != metav1.ConditionTrue || cond.ObservedGeneration != 2 {
		t.Fatalf("condition %+v, want True for generation 2", cond)
	}
	writes := len(c.Actions())
	if done, err := s.Report(ctx, get(), nil); !done || err != nil || len(c.Actions()) != writes+1 { // the Get only
		t.Fatalf("an unchanged condition: %v %v, %d actions after %d", done, err, len(c.Actions()), writes)
	}
	if done, err := s.Report(ctx, get(), []string{"spec.ingress[0].from[0]: exactly one kind of peer must be set"}); !done || err != nil {
		t.Fatalf("report: %v %v", done, err)
	}
	cond = meta.FindStatusCondition(get().Status.Conditions, ClusterPolicyCondition)
	if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != "PartlyFailedClosed" ||
		cond.Message != "enforced failing closed where it cannot be read as written: spec.ingress[0].from[0]: exactly one kind of peer must be set" {
		t.Fatalf("condition %+v", cond)
	}
}

// TestClusterPolicyStatusNotLeading: an agent that does not hold the
// lease writes nothing and is told to try again.
func TestClusterPolicyStatusNotLeading(t *testing.T) {
	p := &cnpv1beta1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", Generation: 1}}
	c := cnpfake.NewSimpleClientset(p)
	leading := false
	s := ClusterPolicyStatus{Client: c, Leading: func() bool { return leading }}
	if done, err := s.Report(context.Background(), p, nil); done || err != nil || len(c.Actions()) != 0 {
		t.Fatalf("not leading: done %v, err %v, %d API calls", done, err, len(c.Actions()))
	}
	leading = true
	if done, err := s.Report(context.Background(), p, nil); !done || err != nil || len(c.Actions()) != 1 {
		t.Fatalf("leading: done %v, err %v, %d API calls", done, err, len(c.Actions()))
	}
}
