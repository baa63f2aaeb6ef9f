package agent

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/weftnet/weft/routing/bgp"
)

// BGPOptions configure the agent's BGP route distribution (--routing bgp).
type BGPOptions struct {
	NodeName     string
	ClusterCIDRs []netip.Prefix
	// ConfigNamespace/ConfigName locate the ConfigMap (key bgp.ConfigKey)
	// and, in the same namespace, the Secrets holding peer passwords.
	ConfigNamespace, ConfigName string
	ListenPort                  int32 // 0: 179
	// Resync re-reads the state (password files included) this often;
	// default 30 s.
	Resync time.Duration
	Log    *slog.Logger
}

// BGP feeds the node's bgp.Controller from the API: Nodes, the BGP
// ConfigMap, the password Secrets, Services and EndpointSlices. A
// ConfigMap that fails validation is logged naming its key and field, and
// the last good configuration stays in force (at start, the defaults).
type BGP struct {
	o      BGPOptions
	client kubernetes.Interface
	ctl    *bgp.Controller
	poke   chan struct{}

	mu       sync.Mutex
	settings bgp.Settings
	cmData   map[string]string // the ConfigMap's data last parsed; nil: none
}

// NewBGP returns the agent's BGP component; Run starts it.
func NewBGP(client kubernetes.Interface, o BGPOptions) (*BGP, error) {
	def, _, err := bgp.Config{}.Validate()
	if err != nil {
		return nil, err
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Resync == 0 {
		o.Resync = 30 * time.Second
	}
	return &BGP{o: o, client: client, settings: def, poke: make(chan struct{}, 1),
		ctl: bgp.NewController(bgp.ControllerOptions{Speaker: bgp.SpeakerOptions{ListenPort: o.ListenPort}, Log: o.Log})}, nil
}

// Run watches the API and drives the speaker until ctx ends; the speaker
// then stops gracefully and the installed routes stay.
func (b *BGP) Run(ctx context.Context) error {
	all := informers.NewSharedInformerFactory(b.client, 0)
	ns := informers.NewSharedInformerFactoryWithOptions(b.client, 0, informers.WithNamespace(b.o.ConfigNamespace))
	nodes := all.Core().V1().Nodes()
	svcs := all.Core().V1().Services()
	eps := all.Discovery().V1().EndpointSlices()
	cms := ns.Core().V1().ConfigMaps()
	secrets := ns.Core().V1().Secrets()
	h := cache.ResourceEventHandlerFuncs{AddFunc: func(any) { b.trigger() }, UpdateFunc: func(_, _ any) { b.trigger() }, DeleteFunc: func(any) { b.trigger() }}
	for _, inf := range []cache.SharedIndexInformer{nodes.Informer(), svcs.Informer(), eps.Informer(), cms.Informer(), secrets.Informer()} {
		if _, err := inf.AddEventHandler(h); err != nil {
			return err
		}
	}
	all.Start(ctx.Done())
	ns.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), nodes.Informer().HasSynced, svcs.Informer().HasSynced, eps.Informer().HasSynced,
		cms.Informer().HasSynced, secrets.Informer().HasSynced) {
		return ctx.Err()
	}
	done := make(chan struct{})
	go func() { b.ctl.Run(ctx); close(done) }()
	b.trigger()
	tick := time.NewTicker(b.o.Resync)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			<-done
			return nil
		case <-b.poke:
		case <-tick.C:
		}
		in, err := b.input(nodes.Lister().List, svcs.Lister().List, eps.Lister().List,
			func() (*corev1.ConfigMap, error) {
				return cms.Lister().ConfigMaps(b.o.ConfigNamespace).Get(b.o.ConfigName)
			},
			func(name string) (*corev1.Secret, error) {
				return secrets.Lister().Secrets(b.o.ConfigNamespace).Get(name)
			})
		if err != nil {
			b.o.Log.Error("BGP: reading the cluster state", "err", err)
			continue
		}
		b.ctl.Update(in)
	}
}

func (b *BGP) trigger() {
	select {
	case b.poke <- struct{}{}:
	default:
	}
}

// input gathers the controller's Input from the listers.
func (b *BGP) input(
	listNodes func(labels.Selector) ([]*corev1.Node, error),
	listSvcs func(labels.Selector) ([]*corev1.Service, error),
	listEPs func(labels.Selector) ([]*discovery.EndpointSlice, error),
	getCM func() (*corev1.ConfigMap, error),
	getSecret func(string) (*corev1.Secret, error),
) (bgp.Input, error) {
	settings := b.config(getCM)
	ns, err := listNodes(labels.Everything())
	if err != nil {
		return bgp.Input{}, err
	}
	in := bgp.Input{Self: b.o.NodeName, Settings: settings, ClusterCIDRs: b.o.ClusterCIDRs}
	for _, n := range ns {
		in.Nodes = append(in.Nodes, BGPNode(n, b.o.Log))
	}
	if settings.ExternalIPs || settings.LBIPs {
		svcs, err := listSvcs(labels.Everything())
		if err != nil {
			return bgp.Input{}, err
		}
		es, err := listEPs(labels.Everything())
		if err != nil {
			return bgp.Input{}, err
		}
		in.Services = BGPServices(svcs, es, b.o.NodeName)
	}
	var errs []error
	in.Passwords, errs = bgp.LoadPasswords(settings, func(name, key string) (string, error) {
		s, err := getSecret(name)
		if err != nil {
			return "", fmt.Errorf("secret %s/%s: %w", b.o.ConfigNamespace, name, err)
		}
		v, ok := s.Data[key]
		if !ok {
			return "", fmt.Errorf("secret %s/%s has no key %q", b.o.ConfigNamespace, name, key)
		}
		return string(v), nil
	})
	for _, e := range errs {
		b.o.Log.Error("BGP: peer skipped", "configmap", b.o.ConfigNamespace+"/"+b.o.ConfigName, "err", e)
	}
	return in, nil
}

// config parses the ConfigMap when it changed; a bad one keeps the last
// good settings. A missing ConfigMap means the defaults.
func (b *BGP) config(getCM func() (*corev1.ConfigMap, error)) bgp.Settings {
	b.mu.Lock()
	defer b.mu.Unlock()
	key := b.o.ConfigNamespace + "/" + b.o.ConfigName
	cm, err := getCM()
	if err != nil {
		if b.cmData != nil {
			b.o.Log.Info("BGP: ConfigMap gone, using the defaults", "configmap", key)
			b.settings, _, _ = bgp.Config{}.Validate()
			b.cmData = nil
		}
		return b.settings
	}
	if b.cmData != nil && maps.Equal(cm.Data, b.cmData) {
		return b.settings
	}
	b.cmData = maps.Clone(cm.Data)
	if b.cmData == nil {
		b.cmData = map[string]string{}
	}
	s, peerErrs, err := bgp.Parse(cm.Data)
	if err != nil {
		b.o.Log.Error("BGP: ConfigMap refused, the previous configuration stays", "configmap", key, "err", err)
		return b.settings
	}
	for _, e := range peerErrs {
		b.o.Log.Error("BGP: peer skipped", "configmap", key, "err", e)
	}
	b.o.Log.Info("BGP: configuration applied", "configmap", key, "asn", s.ASN, "peers", len(s.Peers))
	b.settings = s
	return s
}

// BGPNode converts a Node object for BGP; unparseable fields are logged
// and left out.
func BGPNode(n *corev1.Node, log *slog.Logger) bgp.Node {
	rn, errs := RoutingNode(n)
	for _, e := range errs {
		log.Warn("BGP: skipping field of node", "node", e.Node, "field", e.Field, "err", e.Err)
	}
	return bgp.Node{Name: n.Name, Labels: n.Labels, InternalIPs: rn.InternalIPs, PodCIDRs: rn.PodCIDRs}
}

// BGPServices lists what BGP may announce of each Service: its externalIPs
// and load-balancer ingress IPs, and for externalTrafficPolicy Local
// whether node has a ready endpoint of it. Unparseable addresses are left
// out.
func BGPServices(svcs []*corev1.Service, endpointSlices []*discovery.EndpointSlice, node string) []bgp.Service {
	ready := map[string]bool{} // namespace/name with a ready endpoint on node
	for _, es := range endpointSlices {
		name := es.Labels[discovery.LabelServiceName]
		if name == "" {
			continue
		}
		for _, ep := range es.Endpoints {
			if ep.NodeName != nil && *ep.NodeName == node && (ep.Conditions.Ready == nil || *ep.Conditions.Ready) {
				ready[es.Namespace+"/"+name] = true
			}
		}
	}
	var out []bgp.Service
	for _, s := range svcs {
		key := s.Namespace + "/" + s.Name
		bs := bgp.Service{Key: key, LocalOnly: s.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal, LocalReady: ready[key]}
		for _, ip := range s.Spec.ExternalIPs {
			if a, err := netip.ParseAddr(ip); err == nil {
				bs.ExternalIPs = append(bs.ExternalIPs, a.Unmap())
			}
		}
		if s.Spec.Type == corev1.ServiceTypeLoadBalancer {
			for _, ing := range s.Status.LoadBalancer.Ingress {
				if a, err := netip.ParseAddr(ing.IP); err == nil {
					bs.LBIPs = append(bs.LBIPs, a.Unmap())
				}
			}
		}
		if len(bs.ExternalIPs)+len(bs.LBIPs) > 0 {
			out = append(out, bs)
		}
	}
	slices.SortFunc(out, func(a, b bgp.Service) int { return strings.Compare(a.Key, b.Key) })
	return out
}
