package kube

import (
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	cnpclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"
)

// NewClient returns a clientset from the kubeconfig at path, or from the
// in-cluster configuration when path is empty.
func NewClient(path, userAgent string) (*kubernetes.Clientset, error) {
	cfg, err := RESTConfig(path, userAgent)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

// NewClusterPolicyClient returns a ClusterNetworkPolicy clientset, its
// configuration found as NewClient's.
func NewClusterPolicyClient(path, userAgent string) (*cnpclient.Clientset, error) {
	cfg, err := RESTConfig(path, userAgent)
	if err != nil {
		return nil, err
	}
	return cnpclient.NewForConfig(cfg)
}

// RESTConfig is the client configuration from the kubeconfig at path, or
// the in-cluster one when path is empty.
func RESTConfig(path, userAgent string) (*rest.Config, error) {
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
	return cfg, nil
}
