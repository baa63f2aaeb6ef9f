// Package healthcheck serves the health-check node ports of Services with
// externalTrafficPolicy Local, answering as kube-proxy does: 200 when this
// node has local endpoints for the Service, 503 when it has none, with a
// JSON body load balancers and operators already understand.
package healthcheck

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
)

// Service is one health-checked Service on this node.
type Service struct {
	Namespace, Name string
	LocalEndpoints  int
}

// Server runs one HTTP listener per health-check node port.
type Server struct {
	// Listen opens a listener for a port (tests substitute one).
	Listen func(port uint16) (net.Listener, error)

	mu        sync.Mutex
	services  map[uint16]Service
	listeners map[uint16]net.Listener
}

// NewServer returns a server listening on every address of the node.
func NewServer() *Server {
	return &Server{
		Listen:    func(port uint16) (net.Listener, error) { return net.Listen("tcp", fmt.Sprintf(":%d", port)) },
		services:  map[uint16]Service{},
		listeners: map[uint16]net.Listener{},
	}
}

// Sync makes the server answer for exactly these ports. A port that cannot
// be opened is reported; the others are served.
func (s *Server) Sync(want map[uint16]Service) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for port, ln := range s.listeners {
		if _, ok := want[port]; !ok {
			ln.Close()
			delete(s.listeners, port)
		}
	}
	for port := range want {
		if _, ok := s.listeners[port]; ok {
			continue
		}
		ln, err := s.Listen(port)
		if err != nil {
			errs = append(errs, fmt.Errorf("health check node port %d for %s/%s: %w", port, want[port].Namespace, want[port].Name, err))
			continue
		}
		s.listeners[port] = ln
		go func() { _ = http.Serve(ln, s.handler(port)) }()
	}
	s.services = want
	return errors.Join(errs...)
}

// Close stops every listener.
func (s *Server) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for port, ln := range s.listeners {
		ln.Close()
		delete(s.listeners, port)
	}
}

type reply struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

func (s *Server) handler(port uint16) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		svc, ok := s.services[port]
		s.mu.Unlock()
		if !ok {
			http.Error(w, "no service on this health check port", http.StatusNotFound)
			return
		}
		var r reply
		r.Service.Namespace, r.Service.Name = svc.Namespace, svc.Name
		r.LocalEndpoints, r.ServiceProxyHealthy = svc.LocalEndpoints, true
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("X-Load-Balancing-Endpoint-Weight", fmt.Sprint(svc.LocalEndpoints))
		if svc.LocalEndpoints == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(r)
	})
}
