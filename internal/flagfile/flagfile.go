// Package flagfile sets a daemon's flags from a configuration file, so that
// a ConfigMap mounted as a file configures weft the same way its command
// line does: every key is a flag name and every value goes through that
// flag's own parser, so the file accepts exactly what the flags accept.
//
// The file is a YAML (or JSON) mapping. A scalar value is the flag's text
// (true, 30s, vxlan); a list is joined with commas, for the repeatable
// address and CIDR flags. The path may also be a directory holding one file
// per key, the way a ConfigMap's keys appear when it is mounted, so that
// kustomize overlays can change single keys. A flag given on the command line wins over the
// file. An unknown key, a nested mapping or a value the flag rejects is an
// error naming the file and the key, on which the daemon refuses to start.
package flagfile

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// Apply reads path and sets the flags of fs it names that were not set on
// the command line. Keys in reserved (e.g. the flag naming the file
// itself) are refused.
func Apply(fs *flag.FlagSet, path string, reserved ...string) error {
	values, err := read(path)
	if err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	if err := Set(fs, values, reserved...); err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	return nil
}

func read(path string) (map[string]string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		return Parse(data)
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, err
	}
	values := map[string]string{}
	for _, e := range entries {
		// A mounted ConfigMap also holds ..data and timestamped
		// directories; its keys are the visible names.
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(path, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", e.Name(), err)
		}
		values[e.Name()] = strings.TrimSpace(string(data))
	}
	return values, nil
}

// Parse turns a YAML or JSON mapping into flag texts by key.
func Parse(data []byte) (map[string]string, error) {
	var raw map[string]any
	if err := yaml.UnmarshalStrict(data, &raw); err != nil {
		return nil, fmt.Errorf("not a mapping of flag names to values: %w", err)
	}
	out := make(map[string]string, len(raw))
	for key, v := range raw {
		text, err := flagText(v)
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", key, err)
		}
		out[key] = text
	}
	return out, nil
}

func flagText(v any) (string, error) {
	switch v := v.(type) {
	case nil:
		return "", nil
	case string:
		return v, nil
	case bool, float64, int64, int:
		return fmt.Sprint(v), nil
	case []any:
		parts := make([]string, 0, len(v))
		for i, e := range v {
			if _, nested := e.([]any); nested {
				return "", fmt.Errorf("item %d: a list inside a list", i)
			}
			s, err := flagText(e)
			if err != nil {
				return "", fmt.Errorf("item %d: %w", i, err)
			}
			parts = append(parts, s)
		}
		return strings.Join(parts, ","), nil
	default:
		return "", fmt.Errorf("a %T is not a flag value (want a string, number, boolean or list)", v)
	}
}

// Set checks every key of values against fs first, then sets the flags
// not already set on the command line, in key order. A value a flag rejects
// is an error naming the key: the daemon is meant to refuse to start.
func Set(fs *flag.FlagSet, values map[string]string, reserved ...string) error {
	explicit := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if fs.Lookup(k) == nil {
			return fmt.Errorf("key %q: unknown (the keys are the daemon's flag names without dashes)", k)
		}
		if slices.Contains(reserved, k) {
			return fmt.Errorf("key %q: only accepted on the command line", k)
		}
	}
	for _, k := range keys {
		if explicit[k] {
			continue
		}
		if err := fs.Set(k, values[k]); err != nil {
			return fmt.Errorf("key %q: %w", k, err)
		}
	}
	return nil
}
