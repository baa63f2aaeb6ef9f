package kube

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
)

// fileObjects are the objects of one manifest file, by kind/namespace/name.
type fileObjects map[string]runtime.Object

// ParseManifests decodes a YAML or JSON file holding one or many Services,
// EndpointSlices and Pods (YAML documents separated by "---", a JSON object, or a
// v1 List). Any problem fails the whole file with an error naming the file
// and the line of the document that broke.
func ParseManifests(path string, data []byte) (map[string]runtime.Object, error) {
	out := map[string]runtime.Object{}
	decoder := scheme.Codecs.UniversalDeserializer()
	line := 1
	for i, doc := range splitYAML(data) {
		docLine := line
		line += bytes.Count(doc, []byte("\n")) + 1
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		obj, _, err := decoder.Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("%s:%d (document %d): %w", path, docLine, i+1, err)
		}
		objs := []runtime.Object{obj}
		if list, ok := obj.(*corev1.List); ok {
			objs = objs[:0]
			for j, item := range list.Items {
				o, _, err := decoder.Decode(item.Raw, nil, nil)
				if err != nil {
					return nil, fmt.Errorf("%s:%d (document %d, item %d): %w", path, docLine, i+1, j, err)
				}
				objs = append(objs, o)
			}
		}
		for _, o := range objs {
			key, err := objectKey(o)
			if err != nil {
				return nil, fmt.Errorf("%s:%d (document %d): %w", path, docLine, i+1, err)
			}
			out[key] = o
		}
	}
	return out, nil
}

func objectKey(o runtime.Object) (string, error) {
	switch v := o.(type) {
	case *corev1.Service:
		if v.Namespace == "" {
			v.Namespace = "default"
		}
		return "Service/" + v.Namespace + "/" + v.Name, nil
	case *discoveryv1.EndpointSlice:
		if v.Namespace == "" {
			v.Namespace = "default"
		}
		return "EndpointSlice/" + v.Namespace + "/" + v.Name, nil
	case *corev1.Pod:
		if v.Namespace == "" {
			v.Namespace = "default"
		}
		return "Pod/" + v.Namespace + "/" + v.Name, nil
	}
	return "", fmt.Errorf("kind %T is not a Service, an EndpointSlice or a Pod", o)
}

// splitYAML splits on lines that are exactly "---", keeping line counts.
func splitYAML(data []byte) [][]byte {
	var docs [][]byte
	var cur []byte
	for _, l := range bytes.SplitAfter(data, []byte("\n")) {
		if strings.TrimRight(string(l), "\r\n ") == "---" {
			docs = append(docs, cur)
			cur = nil
			continue
		}
		cur = append(cur, l...)
	}
	return append(docs, cur)
}

func stripComments(doc []byte) []byte {
	var out []byte
	for _, l := range bytes.SplitAfter(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("#")) {
			out = append(out, l...)
		}
	}
	return out
}

// WatchManifests feeds h from the manifest files in dir, reloading changed
// files. A file that does not parse is reported and its last good objects
// are kept; the other files are unaffected.
func WatchManifests(ctx context.Context, dir string, h ServiceHandler, log *slog.Logger) error {
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("--manifests: %w", err)
	}
	w := &manifestWatcher{dir: dir, h: h, log: log, files: map[string]fileObjects{}, stamps: map[string]string{}}
	w.scan()
	h.OnSynced()
	t := newTicker()
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			w.scan()
		}
	}
}

type manifestWatcher struct {
	dir    string
	h      ServiceHandler
	log    *slog.Logger
	files  map[string]fileObjects // last good objects per file
	stamps map[string]string      // size+mtime per file as last read
}

func (w *manifestWatcher) scan() {
	entries, err := os.ReadDir(w.dir)
	if err != nil {
		w.log.Error("reading manifest directory", "dir", w.dir, "err", err)
		return
	}
	seen := map[string]bool{}
	for _, e := range entries {
		ext := filepath.Ext(e.Name())
		if e.IsDir() || !slices.Contains([]string{".yaml", ".yml", ".json"}, ext) || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		path := filepath.Join(w.dir, e.Name())
		seen[path] = true
		info, err := e.Info()
		if err != nil {
			continue
		}
		stamp := fmt.Sprint(info.Size(), info.ModTime().UnixNano())
		if w.stamps[path] == stamp {
			continue
		}
		w.stamps[path] = stamp
		data, err := os.ReadFile(path)
		if err != nil {
			w.log.Error("reading manifest", "file", path, "err", err)
			continue
		}
		objs, err := ParseManifests(path, data)
		if err != nil {
			w.log.Error("manifest rejected, keeping its last good state", "file", path, "err", err)
			continue
		}
		for _, o := range objs {
			if _, isPod := o.(*corev1.Pod); !isPod {
				_, _ = dropBookkeeping(o)
			}
		}
		w.replace(path, objs)
	}
	for path := range w.files {
		if !seen[path] {
			w.replace(path, nil)
			delete(w.stamps, path)
		}
	}
}

// replace swaps one file's objects, sending adds, updates and deletes.
func (w *manifestWatcher) replace(path string, now fileObjects) {
	old := w.files[path]
	for key, o := range now {
		prev, had := old[key]
		if had && reflect.DeepEqual(prev, o) {
			continue
		}
		w.send(prevOrNil(prev, had), o)
	}
	for key, o := range old {
		if _, still := now[key]; !still {
			w.send(o, nil)
		}
	}
	if now == nil {
		delete(w.files, path)
		return
	}
	w.files[path] = now
}

func prevOrNil(o runtime.Object, ok bool) runtime.Object {
	if !ok {
		return nil
	}
	return o
}

func (w *manifestWatcher) send(old, new runtime.Object) {
	switch o := firstNonNil(old, new).(type) {
	case *corev1.Service:
		oldS, _ := old.(*corev1.Service)
		newS, _ := new.(*corev1.Service)
		w.h.OnService(oldS, newS)
	case *discoveryv1.EndpointSlice:
		oldE, _ := old.(*discoveryv1.EndpointSlice)
		newE, _ := new.(*discoveryv1.EndpointSlice)
		w.h.OnEndpointSlice(oldE, newE)
	case *corev1.Pod:
		if ph, ok := w.h.(PodHandler); ok {
			oldP, _ := old.(*corev1.Pod)
			newP, _ := new.(*corev1.Pod)
			ph.OnPod(oldP, newP)
		}
	default:
		w.log.Warn("ignoring object", "type", fmt.Sprintf("%T", o))
	}
}

func firstNonNil(a, b runtime.Object) runtime.Object {
	if a != nil {
		return a
	}
	return b
}
