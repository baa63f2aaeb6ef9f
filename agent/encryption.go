package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/weftnet/weft/routing"
	"github.com/weftnet/weft/routing/wireguard"
)

// Encryption modes (--encryption).
const (
	EncryptionNone      = "none"
	EncryptionWireGuard = "wireguard"
)

// RotateAnnotation requests a new WireGuard key: the agent rotates each
// time its value changes (`kubectl annotate node N weft.dev/wireguard-rotate=$(date +%s) --overwrite`).
const RotateAnnotation = "weft.dev/wireguard-rotate"

// EncryptionOptions configure --encryption wireguard.
type EncryptionOptions struct {
	Mode           string // EncryptionNone (or "") or EncryptionWireGuard
	Strict         bool
	Implementation wireguard.Implementation
	Port           int
}

// encryption is the agent's WireGuard side.
type encryption struct {
	rec *wireguard.Reconciler
	// rotateSeen is the RotateAnnotation value last acted on.
	rotateSeen string
}

// syncEncryptionMode runs syncEncryption with --encryption wireguard, and
// otherwise removes, once, a tunnel an earlier configuration left.
func (a *Agent) syncEncryptionMode(ctx context.Context, self *corev1.Node, me routing.Node, all []*corev1.Node, nodes []routing.Node) error {
	if a.opts.Encryption.Mode == EncryptionWireGuard {
		return a.syncEncryption(ctx, self, me, all, nodes)
	}
	if a.plainChecked {
		return nil
	}
	if err := wireguard.Cleanup("", nil); err != nil {
		return fmt.Errorf("removing the WireGuard tunnel of an earlier configuration: %w", err)
	}
	a.plainChecked = true
	return nil
}

// syncEncryption brings up the tunnel, programs its peers and routes from
// every Node's annotations, and publishes the node's own. The device gets
// the key before it is published, so that a peer that reads it can
// handshake at once.
func (a *Agent) syncEncryption(ctx context.Context, self *corev1.Node, me routing.Node, all []*corev1.Node, rnodes []routing.Node) error {
	underlay, ok := underlayAddr(me)
	if !ok {
		return fmt.Errorf("own node %s has no InternalIP", me.Name)
	}
	if a.enc == nil {
		link, err := linkWithAddr(underlay)
		if err != nil {
			return err
		}
		mtu := link.Attrs().MTU - Overhead(routing.ModeHostGW, EncryptionWireGuard, underlay.Is6())
		rec, err := wireguard.NewReconciler(wireguard.Options{MTU: mtu, Impl: a.opts.Encryption.Implementation, Port: a.opts.Encryption.Port,
			Logf: func(f string, args ...any) {
				a.opts.Log.Error("userspace WireGuard", "device", wireguard.DefaultDevice, "err", fmt.Sprintf(f, args...))
			}})
		if err != nil {
			return err
		}
		a.enc = &encryption{rec: rec, rotateSeen: self.Annotations[RotateAnnotation]}
	}
	if v := self.Annotations[RotateAnnotation]; v != a.enc.rotateSeen {
		pub, err := a.enc.rec.Rotate()
		if err != nil {
			return err
		}
		a.enc.rotateSeen = v
		a.opts.Log.Info("rotated the WireGuard key on request", "node", me.Name, "publicKey", pub.String(), RotateAnnotation, v)
	}
	nodes := make([]wireguard.Node, 0, len(all))
	for i, n := range all {
		nodes = append(nodes, wireguard.Node{Name: n.Name, PodCIDRs: rnodes[i].PodCIDRs,
			PublicKey: n.Annotations[wireguard.PublicKeyAnnotation], Endpoint: n.Annotations[wireguard.EndpointAnnotation]})
	}
	cfg := wireguard.Config{Self: wireguard.Node{Name: me.Name, PodCIDRs: me.PodCIDRs}, Strict: a.opts.Encryption.Strict}
	desired, errs := wireguard.Compute(cfg, nodes)
	for _, e := range errs {
		a.opts.Log.Warn("no WireGuard tunnel to node", "node", e.Node, "field", e.Field, "err", e.Err, "strict", cfg.Strict)
	}
	first := a.enc.rec.Implementation() == ""
	if err := a.enc.rec.Apply(desired); err != nil {
		return fmt.Errorf("wireguard: %w", err)
	}
	if first {
		a.opts.Log.Info("WireGuard encryption", "implementation", a.enc.rec.Implementation(), "device", wireguard.DefaultDevice,
			"port", a.enc.rec.Port(), "strict", cfg.Strict)
	}
	a.metrics.setEncryption(a.enc.rec.Implementation(), len(desired.Peers), len(errs))
	return a.publishWireGuard(ctx, self, netip.AddrPortFrom(underlay, uint16(a.enc.rec.Port())).String())
}

// publishWireGuard puts the node's public key and endpoint on its Node
// object when they differ from what is there.
func (a *Agent) publishWireGuard(ctx context.Context, self *corev1.Node, endpoint string) error {
	want := map[string]string{wireguard.PublicKeyAnnotation: a.enc.rec.PublicKey().String(), wireguard.EndpointAnnotation: endpoint}
	if self.Annotations[wireguard.PublicKeyAnnotation] == want[wireguard.PublicKeyAnnotation] &&
		self.Annotations[wireguard.EndpointAnnotation] == endpoint {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": want}})
	if err != nil {
		return err
	}
	if _, err := a.client.CoreV1().Nodes().Patch(ctx, a.opts.NodeName, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("publishing the WireGuard key on node %s: %w", a.opts.NodeName, err)
	}
	a.opts.Log.Info("published the WireGuard key", "node", a.opts.NodeName, "publicKey", want[wireguard.PublicKeyAnnotation], "endpoint", endpoint)
	return nil
}
