package lab

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/weftnet/weft/internal/netnsutil"
)

// RESTConfig returns a client config for the kubeconfig at path that reaches
// the API server from inside the control-plane namespace, so it works from
// the host without the forwarder and from any lab process.
func RESTConfig(path string) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, err
	}
	cfg.Host = fmt.Sprintf("https://%s:%d", ControlIP, APIServerPort)
	cfg.Dial = netnsutil.Dialer(netnsutil.RunDir+"/"+ControlNS, nil)
	cfg.QPS, cfg.Burst = 100, 200
	return cfg, nil
}

// Client returns a clientset for the kubeconfig at path (see RESTConfig).
func Client(path string) (*kubernetes.Clientset, error) {
	cfg, err := RESTConfig(path)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

// applyManifests creates, or updates when present, every object of a
// multi-document YAML stream. It knows the kinds deploy/ ships.
func applyManifests(ctx context.Context, c kubernetes.Interface, manifests []byte) error {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(manifests)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, gvk, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			return fmt.Errorf("decoding manifest: %w", err)
		}
		if err := applyOne(ctx, c, obj); err != nil {
			return fmt.Errorf("applying %s: %w", gvk.Kind, err)
		}
	}
}

func applyOne(ctx context.Context, c kubernetes.Interface, obj runtime.Object) error {
	var err error
	switch o := obj.(type) {
	case *corev1.Namespace:
		_, err = c.CoreV1().Namespaces().Create(ctx, o, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
	case *corev1.ServiceAccount:
		_, err = c.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
	case *rbacv1.ClusterRole:
		_, err = c.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			_, err = c.RbacV1().ClusterRoles().Update(ctx, o, metav1.UpdateOptions{})
		}
	case *rbacv1.ClusterRoleBinding:
		_, err = c.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			_, err = c.RbacV1().ClusterRoleBindings().Update(ctx, o, metav1.UpdateOptions{})
		}
	default:
		return fmt.Errorf("kind %T is not supported by the lab", obj)
	}
	return err
}
