package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FieldError is a rejected policy: its key, the offending field and why.
type FieldError struct {
	// Kind is "ClusterNetworkPolicy" for one of those (Policy is then its
	// name), empty for a NetworkPolicy.
	Kind   string
	Policy string // namespace/name
	Field  string // e.g. spec.ingress[0].from[1].ipBlock.except[0]
	Err    error
}

func (e *FieldError) Error() string {
	kind := "networkpolicy"
	if e.Kind != "" {
		kind = strings.ToLower(e.Kind)
	}
	return fmt.Sprintf("%s %s: %s: %v", kind, e.Policy, e.Field, e.Err)
}

func (e *FieldError) Unwrap() error { return e.Err }

// Key is an object's namespace/name.
func Key(m metav1.Object) string { return m.GetNamespace() + "/" + m.GetName() }

// Validate checks what the compiler relies on and returns the first problem
// of each kind found, in field order; nil means the policy is usable.
func Validate(p *networkingv1.NetworkPolicy) []*FieldError {
	v := validator{key: Key(p)}
	if _, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector); err != nil {
		v.add("spec.podSelector", err)
	}
	for i, t := range p.Spec.PolicyTypes {
		if t != networkingv1.PolicyTypeIngress && t != networkingv1.PolicyTypeEgress {
			v.add(fmt.Sprintf("spec.policyTypes[%d]", i), fmt.Errorf("unknown policy type %q", t))
		}
	}
	for i, r := range p.Spec.Ingress {
		base := fmt.Sprintf("spec.ingress[%d]", i)
		v.ports(base, r.Ports)
		for j, peer := range r.From {
			v.peer(fmt.Sprintf("%s.from[%d]", base, j), peer)
		}
	}
	for i, r := range p.Spec.Egress {
		base := fmt.Sprintf("spec.egress[%d]", i)
		v.ports(base, r.Ports)
		for j, peer := range r.To {
			v.peer(fmt.Sprintf("%s.to[%d]", base, j), peer)
		}
	}
	return v.errs
}

// Isolates returns the directions a policy isolates its pods in: its
// policyTypes, defaulted as the API does (Ingress, plus Egress when it has
// egress rules); both when the types cannot be read.
func Isolates(p *networkingv1.NetworkPolicy) (ingress, egress bool) {
	if len(p.Spec.PolicyTypes) == 0 {
		return true, len(p.Spec.Egress) > 0
	}
	for _, t := range p.Spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			ingress = true
		case networkingv1.PolicyTypeEgress:
			egress = true
		default:
			return true, true
		}
	}
	return ingress, egress
}

type validator struct {
	kind, key string
	errs      []*FieldError
}

func (v *validator) add(field string, err error) {
	v.errs = append(v.errs, &FieldError{Kind: v.kind, Policy: v.key, Field: field, Err: err})
}

func (v *validator) ports(base string, ports []networkingv1.NetworkPolicyPort) {
	for j, p := range ports {
		f := fmt.Sprintf("%s.ports[%d]", base, j)
		if p.Protocol != nil {
			switch *p.Protocol {
			case corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP:
			default:
				v.add(f+".protocol", fmt.Errorf("unknown protocol %q (want TCP, UDP or SCTP)", *p.Protocol))
			}
		}
		if p.Port != nil {
			if p.Port.Type == 0 { // int
				if p.Port.IntVal < 1 || p.Port.IntVal > 65535 {
					v.add(f+".port", fmt.Errorf("%d is not a port number", p.Port.IntVal))
				}
			} else if p.Port.StrVal == "" || len(p.Port.StrVal) > 15 {
				v.add(f+".port", fmt.Errorf("%q is not a port name", p.Port.StrVal))
			}
		}
		if p.EndPort == nil {
			continue
		}
		switch {
		case p.Port == nil || p.Port.Type != 0:
			v.add(f+".endPort", errors.New("endPort needs a numeric port"))
		case *p.EndPort > 65535:
			v.add(f+".endPort", fmt.Errorf("%d is not a port number", *p.EndPort))
		case *p.EndPort < p.Port.IntVal:
			v.add(f+".endPort", fmt.Errorf("endPort %d is below port %d", *p.EndPort, p.Port.IntVal))
		}
	}
}

func (v *validator) peer(f string, p networkingv1.NetworkPolicyPeer) {
	if p.PodSelector != nil {
		if _, err := metav1.LabelSelectorAsSelector(p.PodSelector); err != nil {
			v.add(f+".podSelector", err)
		}
	}
	if p.NamespaceSelector != nil {
		if _, err := metav1.LabelSelectorAsSelector(p.NamespaceSelector); err != nil {
			v.add(f+".namespaceSelector", err)
		}
	}
	if p.IPBlock == nil {
		if p.PodSelector == nil && p.NamespaceSelector == nil {
			v.add(f, errors.New("a peer needs podSelector, namespaceSelector or ipBlock"))
		}
		return
	}
	if p.PodSelector != nil || p.NamespaceSelector != nil {
		v.add(f+".ipBlock", errors.New("ipBlock cannot be combined with selectors"))
	}
	cidr, err := netip.ParsePrefix(p.IPBlock.CIDR)
	if err != nil {
		v.add(f+".ipBlock.cidr", fmt.Errorf("invalid CIDR %q", p.IPBlock.CIDR))
		return
	}
	cidr = cidr.Masked()
	for k, e := range p.IPBlock.Except {
		ef := fmt.Sprintf("%s.ipBlock.except[%d]", f, k)
		ex, err := netip.ParsePrefix(e)
		if err != nil {
			v.add(ef, fmt.Errorf("invalid CIDR %q", e))
			continue
		}
		if ex.Addr().Is4() != cidr.Addr().Is4() || ex.Bits() <= cidr.Bits() || !cidr.Contains(ex.Addr()) {
			v.add(ef, fmt.Errorf("%s is not strictly inside the block's cidr %s", e, p.IPBlock.CIDR))
		}
	}
}
