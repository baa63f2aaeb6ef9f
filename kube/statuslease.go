package kube

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// StatusLeader elects, through a Lease, the one agent of the cluster that
// writes the ClusterNetworkPolicies' status condition. Every agent compiles
// the same policies and would write the same condition; with a writer
// each, a change would cost one write and as many conflicts as nodes.
// While no agent leads (the leader's node went away, until its lease
// expires), conditions wait: enforcement does not depend on them.
type StatusLeader struct {
	leading atomic.Bool
}

// Leading reports whether this agent holds the lease now.
func (l *StatusLeader) Leading() bool { return l.leading.Load() }

// Lease timing: a leader that stops renewing is replaced within about
// statusLeaseDuration.
const (
	statusLeaseDuration = 30 * time.Second
	statusRenewDeadline = 20 * time.Second
	statusRetryPeriod   = 5 * time.Second
)

// Run takes part in the election of the Lease namespace/name as identity
// (the node's name) until ctx ends, and releases the lease then. onLead
// runs each time this agent starts leading (the caller asks for a sync
// there, so that the new leader writes what is due at once).
func (l *StatusLeader) Run(ctx context.Context, client kubernetes.Interface, namespace, name, identity string, onLead func(), log *slog.Logger) {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: namespace, Name: name},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: identity},
	}
	for ctx.Err() == nil {
		leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   statusLeaseDuration,
			RenewDeadline:   statusRenewDeadline,
			RetryPeriod:     statusRetryPeriod,
			ReleaseOnCancel: true,
			Name:            namespace + "/" + name,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(context.Context) {
					l.leading.Store(true)
					log.Info("writing the ClusterNetworkPolicies' status (lease held)", "lease", namespace+"/"+name)
					onLead()
				},
				OnStoppedLeading: func() {
					if l.leading.Swap(false) {
						log.Info("no longer writing the ClusterNetworkPolicies' status (lease lost)", "lease", namespace+"/"+name)
					}
				},
			},
		})
	}
}
