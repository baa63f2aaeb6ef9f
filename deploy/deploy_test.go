package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
)

// Kustomizations are the directories users apply with `kubectl apply -k`.
var Kustomizations = []string{".", "overlays/cni-only", "overlays/ebpf", "overlays/nftables", "overlays/bgp", "overlays/wireguard"}

// binDir is the repository's bin/, which `make build kube` fills.
func binDir(t *testing.T) string {
	t.Helper()
	bin, err := filepath.Abs("../bin")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"kubectl", "weft-agent"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			t.Fatalf("%s missing: run `make build kube` first", filepath.Join(bin, b))
		}
	}
	return bin
}

// build renders a kustomization with kubectl's kustomize and decodes every
// object strictly: an unknown or duplicated field in any manifest is an
// error, which is the schema check of the manifests.
func build(t *testing.T, bin, dir string) []runtime.Object {
	t.Helper()
	out, err := exec.Command(filepath.Join(bin, "kubectl"), "kustomize", dir).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("kustomize %s: %v\n%s", dir, err, ee.Stderr)
		}
		t.Fatal(err)
	}
	strict := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(out)))
	var objs []runtime.Object
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatal(err)
		}
		obj, gvk, err := strict.Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v\n%s", dir, err, doc)
		}
		if gvk.Kind == "" {
			t.Fatalf("%s: an object without a kind", dir)
		}
		objs = append(objs, obj)
	}
}

func find[T runtime.Object](objs []runtime.Object) []T {
	var out []T
	for _, o := range objs {
		if v, ok := o.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

// agentFlags are the flag names weft-agent accepts, from its -help.
func agentFlags(t *testing.T, bin string) map[string]bool {
	t.Helper()
	out, _ := exec.Command(filepath.Join(bin, "weft-agent"), "-help").CombinedOutput()
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllStringSubmatch(string(out), -1) {
		flags[m[1]] = true
	}
	if !flags["config"] {
		t.Fatalf("bin/weft-agent has no --config flag: rebuild it (make build)\n%s", out)
	}
	return flags
}

func TestKustomizations(t *testing.T) {
	bin := binDir(t)
	flags := agentFlags(t, bin)
	for _, dir := range Kustomizations {
		t.Run(dir, func(t *testing.T) {
			objs := build(t, bin, dir)
			checkAgent(t, objs, flags)
			checkAgentSecurity(t, objs, agentCaps[dir])
			for _, d := range find[*appsv1.Deployment](objs) {
				checkDNS(t, d, objs)
			}
			for _, o := range objs {
				if m, ok := o.(interface{ GetNamespace() string }); ok {
					if ns := m.GetNamespace(); ns != "" && ns != "weft-system" {
						t.Errorf("%T in namespace %q: everything weft runs lives in weft-system", o, ns)
					}
				}
			}
		})
	}
}

func checkAgent(t *testing.T, objs []runtime.Object, flags map[string]bool) {
	t.Helper()
	ds := find[*appsv1.DaemonSet](objs)
	if len(ds) != 1 || ds[0].Name != "weft-agent" {
		t.Fatalf("want one DaemonSet weft-agent, got %d", len(ds))
	}
	spec := ds[0].Spec.Template.Spec
	if !spec.HostNetwork || spec.PriorityClassName != "system-node-critical" {
		t.Errorf("weft-agent: hostNetwork %v, priorityClassName %q", spec.HostNetwork, spec.PriorityClassName)
	}
	// It must run on nodes that are not ready and have no network yet.
	tolerated := func(key string, effect corev1.TaintEffect) bool {
		return slices.ContainsFunc(spec.Tolerations, func(tl corev1.Toleration) bool {
			keyOK := tl.Key == key || (tl.Key == "" && tl.Operator == corev1.TolerationOpExists)
			return keyOK && tl.Operator == corev1.TolerationOpExists && (tl.Effect == "" || tl.Effect == effect)
		})
	}
	for _, key := range []string{"node.kubernetes.io/not-ready", "node.kubernetes.io/network-unavailable"} {
		for _, e := range []corev1.TaintEffect{corev1.TaintEffectNoSchedule, corev1.TaintEffectNoExecute} {
			if !tolerated(key, e) {
				t.Errorf("weft-agent does not tolerate %s:%s", key, e)
			}
		}
	}
	if u := ds[0].Spec.UpdateStrategy; u.Type != appsv1.RollingUpdateDaemonSetStrategyType || u.RollingUpdate == nil || u.RollingUpdate.MaxUnavailable == nil {
		t.Errorf("weft-agent: want a RollingUpdate with a bounded maxUnavailable, got %+v", u)
	}
	if len(spec.InitContainers) != 2 || !slices.Contains(spec.InitContainers[0].Command, "sysctl") ||
		!slices.Contains(spec.InitContainers[1].Command, "install-cni") {
		t.Errorf("weft-agent: want the sysctls and install-cni init containers")
	}

	// The ConfigMap's keys are agent flags; the probes use its health port.
	agent := spec.Containers[0]
	var cmName string
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil {
			cmName = v.ConfigMap.Name
		}
	}
	var cm *corev1.ConfigMap
	for _, c := range find[*corev1.ConfigMap](objs) {
		if c.Name == cmName {
			cm = c
		}
	}
	if cm == nil {
		t.Fatalf("weft-agent mounts ConfigMap %q, which the kustomization does not define", cmName)
	}
	for k := range cm.Data {
		if !flags[k] {
			t.Errorf("ConfigMap %s: key %q is not a weft-agent flag", cm.Name, k)
		}
	}
	_, port, _ := strings.Cut(cm.Data["healthz-addr"], ":")
	for name, p := range map[string]*corev1.Probe{"readiness": agent.ReadinessProbe, "liveness": agent.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || strconv.Itoa(p.HTTPGet.Port.IntValue()) != port {
			t.Errorf("weft-agent: %s probe must GET the health port %q", name, port)
		}
	}
}

// agentCaps are the capabilities weft-agent's container holds in each
// kustomization, and no more (docs/deploy.md says why each).
var agentCaps = map[string][]string{
	".":                  {"BPF", "NET_ADMIN", "NET_RAW"},
	"overlays/cni-only":  {"NET_ADMIN", "NET_RAW"},
	"overlays/nftables":  {"BPF", "NET_ADMIN"},
	"overlays/ebpf":      {"BPF", "NET_ADMIN", "NET_RAW", "PERFMON", "SYS_ADMIN", "SYS_PTRACE"},
	"overlays/bgp":       {"BPF", "NET_ADMIN", "NET_BIND_SERVICE", "NET_RAW"},
	"overlays/wireguard": {"BPF", "NET_ADMIN", "NET_RAW"},
}

// checkAgentSecurity: the only privileged container of the DaemonSet is
// the sysctls init container (running weftctl sysctl alone); the agent
// drops every capability but its data plane's and cannot gain any (no
// privilege escalation); install-cni needs none.
func checkAgentSecurity(t *testing.T, objs []runtime.Object, caps []string) {
	t.Helper()
	if caps == nil {
		t.Fatal("no capability list for this kustomization in agentCaps")
	}
	spec := find[*appsv1.DaemonSet](objs)[0].Spec.Template.Spec
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		sc := c.SecurityContext
		if sc == nil {
			t.Errorf("weft-agent: container %s has no securityContext", c.Name)
			continue
		}
		if sc.Privileged != nil && *sc.Privileged {
			if c.Name != "sysctls" || len(c.Command) < 2 || c.Command[1] != "sysctl" {
				t.Errorf("weft-agent: container %s is privileged: only the sysctls init container may be", c.Name)
			}
			continue
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("weft-agent: container %s: want allowPrivilegeEscalation false", c.Name)
		}
		var add []string
		if sc.Capabilities != nil && slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			for _, cp := range sc.Capabilities.Add {
				add = append(add, string(cp))
			}
		} else {
			t.Errorf("weft-agent: container %s: want capabilities.drop [ALL]", c.Name)
		}
		slices.Sort(add)
		want := []string(nil)
		if c.Name == "agent" {
			want = caps
		}
		if !slices.Equal(add, want) {
			t.Errorf("weft-agent: container %s: capabilities.add %v, want %v", c.Name, add, want)
		}
	}
}

func checkDNS(t *testing.T, d *appsv1.Deployment, objs []runtime.Object) {
	t.Helper()
	spec := d.Spec.Template.Spec
	if spec.DNSPolicy != corev1.DNSDefault {
		t.Errorf("weft-dns: dnsPolicy %q: its upstreams must be the node's resolvers, not itself", spec.DNSPolicy)
	}
	var svc *corev1.Service
	for _, s := range find[*corev1.Service](objs) {
		if s.Name == d.Name {
			svc = s
		}
	}
	if svc == nil {
		t.Fatal("weft-dns: no Service")
	}
	ports := map[string]int32{}
	for _, p := range spec.Containers[0].Ports {
		ports[p.Name] = p.ContainerPort
	}
	for _, p := range svc.Spec.Ports {
		if p.Port != 53 || ports[p.TargetPort.StrVal] == 0 {
			t.Errorf("weft-dns Service port %s: %d -> %s, want 53 to a named container port", p.Name, p.Port, p.TargetPort.String())
		}
	}
	if pdbs := find[*policyv1.PodDisruptionBudget](objs); len(pdbs) != 1 {
		t.Errorf("weft-dns: want a PodDisruptionBudget")
	}
	if spec.Affinity == nil || spec.Affinity.PodAntiAffinity == nil {
		t.Errorf("weft-dns: want anti-affinity between replicas")
	}
}
