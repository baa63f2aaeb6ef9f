package kube

import (
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// NewClient returns a clientset from the kubeconfig at path, or from the
// in-cluster configuration when path is empty.
func NewClient(path, userAgent string) (*kubernetes.Clientset, error) {
	var cfg *rest.Config
	var err error
	if path != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", path)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, err
	}
	cfg.UserAgent = userAgent
	return kubernetes.NewForConfig(cfg)
}
