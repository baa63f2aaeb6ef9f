// Package npapi runs the network-policy-api conformance suite
// (sigs.k8s.io/network-policy-api/conformance: its tests, base manifests
// and probes, unchanged) against the cluster of $KUBECONFIG. It is the
// suite's own conformance_test.go driver, written for weft's lab, with one
// addition: -no-sctp, for nodes whose kernel has no SCTP (the base pods'
// SCTP servers would crash-loop and keep every pod unready, so they are
// left out, and the tests made of SCTP probes only are skipped; the SCTP
// probes inside other tests still run and fail, and the runner,
// test/conformance, reports those apart).
//
//	bin/npapi-conformance.test -test.v [-supported-features LIST] [-no-sctp] [-test.run RE]
package npapi

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"text/template"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"

	api "sigs.k8s.io/network-policy-api/apis/v1beta1"
	"sigs.k8s.io/network-policy-api/conformance/tests"
	confkube "sigs.k8s.io/network-policy-api/conformance/utils/kubernetes"
	"sigs.k8s.io/network-policy-api/conformance/utils/suite"
)

var (
	features = flag.String("supported-features", "ClusterNetworkPolicy,ClusterNetworkPolicyNamedPorts,ClusterNetworkPolicyEgressNodePeers",
		"comma-separated features of the suite the implementation supports")
	noSCTP = flag.Bool("no-sctp", false, "the nodes' kernel has no SCTP: leave the base pods' SCTP servers out and skip the SCTP-only tests")
	debug  = flag.Bool("debug", false, "the suite's debug logs")
)

// noSCTPReason is the skip message of the SCTP-only tests under -no-sctp.
const noSCTPReason = "-no-sctp: the nodes' kernel has no SCTP"

// hostNetworkPorts is how many ports the base manifest's host-network
// pod takes ({{ index .HostNetworkPorts 0..7 }}), from the suite's
// default start, as its Setup gives them.
const (
	hostNetworkPortStart = 34345
	hostNetworkPorts     = 8
)

func TestConformance(t *testing.T) {
	cfg, err := config.GetConfig()
	if err != nil {
		t.Fatalf("loading the kubeconfig: %v", err)
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatalf("API client: %v", err)
	}
	if err := api.Install(c.Scheme()); err != nil {
		t.Fatalf("installing the ClusterNetworkPolicy scheme: %v", err)
	}
	clientset, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("API clientset: %v", err)
	}
	s := suite.New(suite.Options{
		Client:               c,
		ClientSet:            clientset,
		KubeConfig:           *cfg,
		Debug:                *debug,
		CleanupBaseResources: true,
		SupportedFeatures:    suite.ParseSupportedFeatures(*features),
	})
	t.Logf("supported features: %v; no SCTP: %t", sortedFeatures(s), *noSCTP)

	var selected []suite.ConformanceTest
	for _, test := range tests.ConformanceTests {
		if *noSCTP && strings.Contains(test.ShortName, "SCTP") {
			t.Run(test.ShortName, func(t *testing.T) { t.Skip(noSCTPReason) })
			continue
		}
		selected = append(selected, test)
	}
	if *noSCTP {
		setupWithoutSCTP(t, s)
	} else {
		s.Setup(t)
	}
	s.Run(t, selected)
}

func sortedFeatures(s *suite.ConformanceTestSuite) []string {
	var res []string
	for f := range s.SupportedFeatures {
		res = append(res, string(f))
	}
	slices.Sort(res)
	return res
}

// setupWithoutSCTP does what the suite's Setup does (the host-network
// ports, the base manifest applied and its StatefulSets ready) with the
// containers that serve SCTP left out of the base manifest.
func setupWithoutSCTP(t *testing.T, s *suite.ConformanceTestSuite) {
	ports := make([]int, hostNetworkPorts)
	for i := range ports {
		ports[i] = hostNetworkPortStart + i
	}
	s.HostNetworkPorts = ports
	s.Applier.HostNetworkPorts = ports
	s.Applier.FS = s.FS

	raw, err := s.FS.ReadFile(s.BaseManifests)
	if err != nil {
		t.Fatalf("reading the base manifest: %v", err)
	}
	objs, err := baseObjects(raw, ports)
	if err != nil {
		t.Fatalf("%s: %v", s.BaseManifests, err)
	}
	ctx := context.Background()
	for _, o := range objs {
		if err := s.Client.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("creating %s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
		}
		t.Cleanup(func() {
			if err := s.Client.Delete(context.Background(), o); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("deleting %s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
			}
		})
	}
	for _, o := range objs {
		if o.GetKind() == "StatefulSet" {
			waitReady(t, s, o.GetNamespace(), o.GetName())
		}
	}
	t.Logf("base manifest applied without its SCTP servers; %d objects, every StatefulSet ready", len(objs))
}

// baseObjects renders the base manifest with the host-network ports and
// decodes it, the SCTP-serving containers (agnhost porter with a
// SERVE_SCTP_PORT_ variable) removed from every StatefulSet.
func baseObjects(raw []byte, ports []int) ([]*unstructured.Unstructured, error) {
	tmpl, err := template.New("base").Parse(string(raw))
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := tmpl.Execute(&buf, confkube.TemplateData{HostNetworkPorts: ports}); err != nil {
		return nil, err
	}
	dec := yaml.NewYAMLOrJSONDecoder(&buf, 4096)
	var objs []*unstructured.Unstructured
	dropped := 0
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, err
		}
		if len(u.Object) == 0 {
			continue
		}
		if u.GetKind() == "StatefulSet" {
			n, err := dropSCTPServers(u)
			if err != nil {
				return nil, fmt.Errorf("StatefulSet %s/%s: %w", u.GetNamespace(), u.GetName(), err)
			}
			dropped += n
		}
		objs = append(objs, u)
	}
	if dropped == 0 {
		return nil, errors.New("no SCTP server found to leave out: the suite's base manifest changed")
	}
	return objs, nil
}

func dropSCTPServers(u *unstructured.Unstructured) (int, error) {
	path := []string{"spec", "template", "spec", "containers"}
	containers, _, err := unstructured.NestedSlice(u.Object, path...)
	if err != nil {
		return 0, err
	}
	var keep []any
	for _, c := range containers {
		if !servesSCTP(c) {
			keep = append(keep, c)
		}
	}
	if err := unstructured.SetNestedSlice(u.Object, keep, path...); err != nil {
		return 0, err
	}
	return len(containers) - len(keep), nil
}

func servesSCTP(container any) bool {
	m, _ := container.(map[string]any)
	env, _, _ := unstructured.NestedSlice(m, "env")
	for _, e := range env {
		if em, ok := e.(map[string]any); ok {
			if name, _ := em["name"].(string); strings.HasPrefix(name, "SERVE_SCTP_PORT_") {
				return true
			}
		}
	}
	return false
}

// waitReady waits until every replica of the StatefulSet is ready.
func waitReady(t *testing.T, s *suite.ConformanceTestSuite, ns, name string) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(context.Background(), time.Second, s.TimeoutConfig.NamespacesMustBeReady, true,
		func(ctx context.Context) (bool, error) {
			st, err := s.ClientSet.AppsV1().StatefulSets(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				last = err.Error()
				return false, nil
			}
			want := int32(1)
			if st.Spec.Replicas != nil {
				want = *st.Spec.Replicas
			}
			last = fmt.Sprintf("%d/%d replicas ready", st.Status.ReadyReplicas, want)
			return st.Status.ReadyReplicas == want, nil
		})
	if err != nil {
		t.Fatalf("StatefulSet %s/%s not ready: %s", ns, name, last)
	}
}
