package kubelet

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"time"

	"github.com/weftnet/weft/internal/proc"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/cache"
)

// monitor keeps the containers of the running image pods going, once a
// second: a container that exited is restarted (restartPolicy Always,
// with a back-off), and probes run at their periods. A change of
// readiness or a restart re-queues the pod so its status is updated.
func (k *Kubelet) monitor(ctx context.Context) {
	last := map[string]time.Time{} // probe key -> last run
	every(ctx, time.Second, func() {
		for _, run := range k.runs() {
			if run.Tag == "" {
				continue
			}
			obj, exists, _ := k.pods.GetByKey(run.Namespace + "/" + run.Name)
			if !exists {
				continue
			}
			pod := obj.(*corev1.Pod)
			if pod.UID != run.UID || pod.DeletionTimestamp != nil {
				continue
			}
			if k.tend(ctx, pod, run, last) {
				if key, err := cache.MetaNamespaceKeyFunc(pod); err == nil {
					k.queue.Add(key)
				}
			}
		}
	})
}

// tend restarts dead containers and probes live ones; it reports whether
// the pod's status changed.
func (k *Kubelet) tend(ctx context.Context, pod *corev1.Pod, run *podRun, last map[string]time.Time) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	changed := false
	for _, c := range pod.Spec.Containers {
		cr := run.container(c.Name)
		if cr == nil {
			continue
		}
		if !proc.Running(cr.PID) {
			if cr.nextStart.IsZero() {
				var ws syscall.WaitStatus
				if pid, _ := syscall.Wait4(cr.PID, &ws, syscall.WNOHANG, nil); pid == cr.PID {
					cr.LastExit = exitReason(ws)
				}
				backoff := time.Duration(1<<min(cr.Restarts, 4)) * time.Second
				cr.nextStart, cr.Ready = time.Now().Add(backoff), false
				k.opts.Log.Warn("container exited", "pod", run.Namespace+"/"+run.Name, "container", c.Name, "exit", cr.LastExit, "restart in", backoff)
				changed = true
			}
			if time.Now().Before(cr.nextStart) || pod.Spec.RestartPolicy == corev1.RestartPolicyNever {
				continue
			}
			files, err := k.prepare(ctx, pod, run)
			var spec ContainerSpec
			if err == nil {
				spec, err = k.containerSpec(ctx, pod, run, files, c)
			}
			if err == nil {
				err = k.launch(run, cr, spec)
			}
			if err != nil {
				k.opts.Log.Warn("restarting container", "pod", run.Namespace+"/"+run.Name, "container", c.Name, "err", err)
				cr.nextStart = time.Now().Add(5 * time.Second)
				continue
			}
			cr.Restarts++
			cr.nextStart, cr.failures = time.Time{}, 0
			_ = k.saveLocked(run)
			changed = true
			continue
		}
		key := string(run.UID) + "/" + c.Name
		if p := c.ReadinessProbe; p == nil {
			changed = changed || !cr.Ready
			cr.Ready = true
		} else if due(last, key+"/ready", p) {
			ok := k.probe(run, c, p) == nil
			changed = changed || ok != cr.Ready
			cr.Ready = ok
		}
		if p := c.LivenessProbe; p != nil && time.Since(cr.Started) >= time.Duration(p.InitialDelaySeconds)*time.Second && due(last, key+"/live", p) {
			if err := k.probe(run, c, p); err == nil {
				cr.failures = 0
			} else if cr.failures++; cr.failures >= int(max(p.FailureThreshold, 1)) {
				k.opts.Log.Warn("liveness probe failed: killing the container", "pod", run.Namespace+"/"+run.Name, "container", c.Name, "err", err)
				_ = syscall.Kill(cr.PID, syscall.SIGKILL)
			}
		}
	}
	return changed
}

func exitReason(ws syscall.WaitStatus) string {
	if ws.Signaled() {
		return "killed by " + ws.Signal().String()
	}
	return "exit code " + strconv.Itoa(ws.ExitStatus())
}

// due reports whether a probe's period has passed since it last ran, and
// records this run.
func due(last map[string]time.Time, key string, p *corev1.Probe) bool {
	period := time.Duration(max(p.PeriodSeconds, 1)) * time.Second
	if time.Since(last[key]) < period {
		return false
	}
	last[key] = time.Now()
	return true
}

// probe runs an httpGet probe against the pod's address, from the node.
func (k *Kubelet) probe(run *podRun, c corev1.Container, p *corev1.Probe) error {
	h := p.HTTPGet
	if h == nil {
		return fmt.Errorf("container %s: only httpGet probes are supported by the lab", c.Name)
	}
	port, err := probePort(c, h.Port)
	if err != nil {
		return err
	}
	host := h.Host
	if host == "" && len(run.IPs) > 0 {
		host = run.IPs[0]
	}
	timeout := time.Duration(max(p.TimeoutSeconds, 1)) * time.Second
	client := http.Client{Timeout: timeout}
	resp, err := client.Get("http://" + net.JoinHostPort(host, strconv.Itoa(port)) + h.Path)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("%s: HTTP %d", h.Path, resp.StatusCode)
	}
	return nil
}

func probePort(c corev1.Container, port intstr.IntOrString) (int, error) {
	if port.Type == intstr.Int {
		return port.IntValue(), nil
	}
	for _, p := range c.Ports {
		if p.Name == port.StrVal {
			return int(p.ContainerPort), nil
		}
	}
	return 0, fmt.Errorf("container %s: no port named %q", c.Name, port.StrVal)
}
