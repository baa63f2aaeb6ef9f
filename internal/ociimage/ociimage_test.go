package ociimage

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// layer makes a directory tree with a file, a subdirectory and a symlink.
func layer(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "etc/sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "etc/sub/file"), []byte("content\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("sub/file", filepath.Join(dir, "etc/link")); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestWriteUnpack(t *testing.T) {
	img := Image{
		Name:       "registry.example:5000/team/app:1.2",
		Aliases:    []string{"registry.example:5000/team/app:1", "docker.io/library/app:latest"},
		User:       "65535:65535",
		Env:        []string{"PATH=/bin"},
		Entrypoint: []string{"/app", "serve"},
		Cmd:        []string{"--port=80"},
		WorkingDir: "/srv",
		Labels:     map[string]string{"k": "v"},
		Layers:     []string{layer(t)},
	}
	archive := filepath.Join(t.TempDir(), "app.oci.tar")
	if err := Write(archive, img); err != nil {
		t.Fatal(err)
	}

	root := t.TempDir()
	name, cfg, err := Unpack(archive, root)
	if err != nil {
		t.Fatal(err)
	}
	if name != img.Name {
		t.Errorf("Unpack returned name %q, want %q", name, img.Name)
	}
	c := cfg.Config
	if c.User != img.User || !slices.Equal(c.Env, img.Env) || !slices.Equal(c.Entrypoint, img.Entrypoint) ||
		!slices.Equal(c.Cmd, img.Cmd) || c.WorkingDir != img.WorkingDir || c.Labels["k"] != "v" {
		t.Errorf("configuration %+v does not match the image %+v", c, img)
	}
	if b, err := os.ReadFile(filepath.Join(root, "etc/link")); err != nil || string(b) != "content\n" {
		t.Errorf("etc/link in the unpacked tree: %q %v", b, err)
	}

	names, err := Names(archive)
	if err != nil {
		t.Fatal(err)
	}
	if want := append([]string{img.Name}, img.Aliases...); !slices.Equal(names, want) {
		t.Errorf("Names = %q, want %q", names, want)
	}
	blobs, err := readArchive(archive)
	if err != nil {
		t.Fatal(err)
	}
	var idx Index
	if err := json.Unmarshal(blobs["index.json"], &idx); err != nil {
		t.Fatal(err)
	}
	for i, tag := range []string{"1.2", "1", "latest"} {
		m := idx.Manifests[i]
		if m.Annotations["org.opencontainers.image.ref.name"] != tag || m.Digest != idx.Manifests[0].Digest || m.MediaType != MediaManifest {
			t.Errorf("index entry %d: %+v, want tag %s and the first entry's manifest", i, m, tag)
		}
	}
}

// TestConfigLeavesOutEmptyFields: an image that sets only Env and Labels
// has the configuration it had before the other fields existed, so its
// digest does not change.
func TestConfigLeavesOutEmptyFields(t *testing.T) {
	archive := filepath.Join(t.TempDir(), "a.oci.tar")
	if err := Write(archive, Image{Name: "example/a:1", Env: []string{"A=1"}, Labels: map[string]string{"k": "v"}}); err != nil {
		t.Fatal(err)
	}
	blobs, err := readArchive(archive)
	if err != nil {
		t.Fatal(err)
	}
	var idx Index
	var m Manifest
	if err := json.Unmarshal(blobs["index.json"], &idx); err != nil {
		t.Fatal(err)
	}
	if err := decodeBlob(blobs, idx.Manifests[0], &m); err != nil {
		t.Fatal(err)
	}
	raw, err := blobFor(blobs, m.Config)
	if err != nil {
		t.Fatal(err)
	}
	if want := `"config":{"Env":["A=1"],"Labels":{"k":"v"}}`; !bytes.Contains(raw, []byte(want)) {
		t.Errorf("configuration %s, want it to contain %s", raw, want)
	}
}

func TestWriteIsReproducible(t *testing.T) {
	dir := layer(t)
	img := Image{Name: "example/a:1", Aliases: []string{"example/b:2"}, Entrypoint: []string{"/a"}, Layers: []string{dir}}
	out := t.TempDir()
	first, second := filepath.Join(out, "1.tar"), filepath.Join(out, "2.tar")
	if err := Write(first, img); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(filepath.Join(dir, "etc/sub/file"), later, later); err != nil {
		t.Fatal(err)
	}
	if err := Write(second, img); err != nil {
		t.Fatal(err)
	}
	a, err := os.ReadFile(first)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(second)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Error("the same image written twice gave different archives")
	}
}

func TestWriteRefusesBadNames(t *testing.T) {
	for _, img := range []Image{
		{Name: "app"},
		{Name: "registry:5000/app"},
		{Name: "app:"},
		{Name: "app:1", Aliases: []string{"app:2", "app:1"}},
	} {
		if err := Write(filepath.Join(t.TempDir(), "x.tar"), img); err == nil {
			t.Errorf("Write accepted names %q %q", img.Name, img.Aliases)
		}
	}
}

func TestReadIndexWantsOneImage(t *testing.T) {
	for _, tc := range []struct {
		index string
		ok    bool
	}{
		{`{"manifests":[{"digest":"sha256:a"},{"digest":"sha256:a"}]}`, true},
		{`{"manifests":[{"digest":"sha256:a"},{"digest":"sha256:b"}]}`, false},
		{`{"manifests":[]}`, false},
		{`not json`, false},
	} {
		_, err := readIndex("test", map[string][]byte{"index.json": []byte(tc.index)})
		if (err == nil) != tc.ok {
			t.Errorf("readIndex(%s): %v, want ok %v", tc.index, err, tc.ok)
		}
	}
}
