package lab

import (
	"fmt"

	"k8s.io/client-go/kubernetes"
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
