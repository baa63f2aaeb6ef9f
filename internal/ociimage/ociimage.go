// Package ociimage writes and reads container images as OCI archives (a tar
// of an OCI image layout: oci-layout, index.json, blobs/sha256/...), so that
// weft's image and the lab's test images are built on machines without a
// container engine, and read back by their tests. An archive holds one
// image under one or more names: index.json lists the same manifest once
// per name, so that `ctr images import` creates every name. Archives are
// reproducible: entries are sorted, owned by root and dated at a fixed time,
// and gzip records no name or time.
package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/weftnet/weft/internal/fsutil"
)

// Media types of the OCI image spec.
const (
	MediaIndex    = "application/vnd.oci.image.index.v1+json"
	MediaManifest = "application/vnd.oci.image.manifest.v1+json"
	MediaConfig   = "application/vnd.oci.image.config.v1+json"
	MediaLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"
)

// epoch dates every entry: the image's content, not the build time,
// decides its digest.
var epoch = time.Unix(0, 0).UTC()

// Descriptor points at a blob.
type Descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Manifest is an OCI image manifest.
type Manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        Descriptor   `json:"config"`
	Layers        []Descriptor `json:"layers"`
}

// Index is an OCI image index (index.json).
type Index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []Descriptor `json:"manifests"`
}

// Config is the part of the image configuration weft sets.
type Config struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Config       struct {
		User       string            `json:"User,omitempty"`
		Env        []string          `json:"Env,omitempty"`
		Entrypoint []string          `json:"Entrypoint,omitempty"`
		Cmd        []string          `json:"Cmd,omitempty"`
		WorkingDir string            `json:"WorkingDir,omitempty"`
		Labels     map[string]string `json:"Labels,omitempty"`
	} `json:"config"`
	RootFS struct {
		Type    string   `json:"type"`
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
}

// Image is what Write puts in an archive: names, a configuration and
// layers, each a directory tree taken as it is on disk.
type Image struct {
	// Name is the full reference with a tag, e.g. ghcr.io/weftnet/weft:dev;
	// Unpack returns it.
	Name string
	// Aliases are more references to the same image.
	Aliases []string
	// The configuration: what a container runs, as whom, where and with
	// which environment (empty fields are left out).
	User       string
	Env        []string
	Entrypoint []string
	Cmd        []string
	WorkingDir string
	Labels     map[string]string
	// Layers are directories, bottom first.
	Layers []string
}

type blob struct {
	digest string
	data   []byte
}

func newBlob(data []byte) blob {
	sum := sha256.Sum256(data)
	return blob{"sha256:" + hex.EncodeToString(sum[:]), data}
}

// Write writes img as an OCI archive to path (through a temporary file
// renamed at the end): one manifest, listed in index.json under Name and
// then each alias, with the tag and the full reference as annotations.
func Write(path string, img Image) error {
	names := append([]string{img.Name}, img.Aliases...)
	refs := make([]Descriptor, len(names))
	for i, n := range names {
		slash := strings.LastIndex(n, "/")
		colon := strings.LastIndex(n, ":")
		if colon <= slash || colon == len(n)-1 || slices.Contains(names[:i], n) {
			return fmt.Errorf("image name %q: want a distinct reference with a tag", n)
		}
		refs[i].Annotations = map[string]string{
			"org.opencontainers.image.ref.name": n[colon+1:],
			"io.containerd.image.name":          n,
		}
	}
	var blobs []blob
	var cfg Config
	cfg.Architecture, cfg.OS = "amd64", "linux"
	c := &cfg.Config
	c.User, c.Env, c.WorkingDir, c.Labels = img.User, img.Env, img.WorkingDir, img.Labels
	c.Entrypoint, c.Cmd = img.Entrypoint, img.Cmd
	cfg.RootFS.Type = "layers"
	m := Manifest{SchemaVersion: 2, MediaType: MediaManifest}
	for _, dir := range img.Layers {
		raw, err := tarDir(dir)
		if err != nil {
			return fmt.Errorf("layer %s: %w", dir, err)
		}
		diff := newBlob(raw)
		var gz bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
		if _, err := zw.Write(raw); err != nil {
			return err
		}
		if err := zw.Close(); err != nil {
			return err
		}
		layer := newBlob(gz.Bytes())
		blobs = append(blobs, layer)
		cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, diff.digest)
		m.Layers = append(m.Layers, Descriptor{MediaType: MediaLayer, Digest: layer.digest, Size: int64(len(layer.data))})
	}
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	cb := newBlob(cfgJSON)
	blobs = append(blobs, cb)
	m.Config = Descriptor{MediaType: MediaConfig, Digest: cb.digest, Size: int64(len(cb.data))}
	mJSON, err := json.Marshal(m)
	if err != nil {
		return err
	}
	mb := newBlob(mJSON)
	blobs = append(blobs, mb)
	for i := range refs {
		refs[i].MediaType, refs[i].Digest, refs[i].Size = MediaManifest, mb.digest, int64(len(mb.data))
	}
	idx := Index{SchemaVersion: 2, MediaType: MediaIndex, Manifests: refs}
	idxJSON, err := json.Marshal(idx)
	if err != nil {
		return err
	}

	var archive bytes.Buffer
	tw := tar.NewWriter(&archive)
	add := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: epoch, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := add("index.json", idxJSON); err != nil {
		return err
	}
	for _, b := range blobs {
		if err := add("blobs/sha256/"+strings.TrimPrefix(b.digest, "sha256:"), b.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(path, archive.Bytes(), 0o644)
}

// tarDir is dir's tree as an uncompressed tar, sorted, owned by root,
// dated at epoch.
func tarDir(dir string) ([]byte, error) {
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			paths = append(paths, p)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(paths)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		fi, err := os.Lstat(p)
		if err != nil {
			return nil, err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return nil, err
			}
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return nil, err
		}
		rel, _ := filepath.Rel(dir, p)
		h.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			h.Name += "/"
		}
		h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
		h.ModTime, h.AccessTime, h.ChangeTime = epoch, time.Time{}, time.Time{}
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return nil, err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			if err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
