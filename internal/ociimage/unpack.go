package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Unpack reads an OCI archive, checks every blob against its digest, and
// extracts the image's layers in order into dir (which must exist). It
// returns the image's first name and its configuration.
func Unpack(archive, dir string) (name string, cfg Config, err error) {
	blobs, err := readArchive(archive)
	if err != nil {
		return "", cfg, err
	}
	idx, err := readIndex(archive, blobs)
	if err != nil {
		return "", cfg, err
	}
	md := idx.Manifests[0]
	var m Manifest
	if err := decodeBlob(blobs, md, &m); err != nil {
		return "", cfg, fmt.Errorf("%s: manifest: %w", archive, err)
	}
	if err := decodeBlob(blobs, m.Config, &cfg); err != nil {
		return "", cfg, fmt.Errorf("%s: config: %w", archive, err)
	}
	if len(cfg.RootFS.DiffIDs) != len(m.Layers) {
		return "", cfg, fmt.Errorf("%s: %d layers but %d diff_ids", archive, len(m.Layers), len(cfg.RootFS.DiffIDs))
	}
	for i, l := range m.Layers {
		data, err := blobFor(blobs, l)
		if err != nil {
			return "", cfg, fmt.Errorf("%s: layer %d: %w", archive, i, err)
		}
		if err := extract(data, cfg.RootFS.DiffIDs[i], dir); err != nil {
			return "", cfg, fmt.Errorf("%s: layer %d: %w", archive, i, err)
		}
	}
	return md.Annotations["io.containerd.image.name"], cfg, nil
}

// Names returns the names of the image in an OCI archive, in the order of
// its index.
func Names(archive string) ([]string, error) {
	blobs, err := readArchive(archive)
	if err != nil {
		return nil, err
	}
	idx, err := readIndex(archive, blobs)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(idx.Manifests))
	for i, m := range idx.Manifests {
		names[i] = m.Annotations["io.containerd.image.name"]
	}
	return names, nil
}

// readIndex decodes index.json, which must list one manifest (under one or
// more names).
func readIndex(archive string, blobs map[string][]byte) (Index, error) {
	var idx Index
	if err := json.Unmarshal(blobs["index.json"], &idx); err != nil {
		return idx, fmt.Errorf("%s: index.json: %w", archive, err)
	}
	if len(idx.Manifests) == 0 {
		return idx, fmt.Errorf("%s: index.json lists no manifest", archive)
	}
	for _, m := range idx.Manifests[1:] {
		if m.Digest != idx.Manifests[0].Digest {
			return idx, fmt.Errorf("%s: index.json lists manifests %s and %s: want one image", archive, idx.Manifests[0].Digest, m.Digest)
		}
	}
	return idx, nil
}

func readArchive(path string) (map[string][]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return nil, err
		}
		out[h.Name] = data
	}
}

func blobFor(blobs map[string][]byte, d Descriptor) ([]byte, error) {
	data, ok := blobs["blobs/sha256/"+strings.TrimPrefix(d.Digest, "sha256:")]
	if !ok {
		return nil, fmt.Errorf("blob %s missing", d.Digest)
	}
	if got := digest(data); got != d.Digest || int64(len(data)) != d.Size {
		return nil, fmt.Errorf("blob %s: content has digest %s and size %d (want size %d)", d.Digest, got, len(data), d.Size)
	}
	return data, nil
}

func decodeBlob(blobs map[string][]byte, d Descriptor, v any) error {
	data, err := blobFor(blobs, d)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, v)
}

func digest(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// extract untars one gzip layer into dir, checking its diff ID; entries
// that would land outside dir are refused.
func extract(data []byte, diffID, dir string) error {
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return err
	}
	h := sha256.New()
	tr := tar.NewReader(io.TeeReader(zr, h))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		target := filepath.Join(dir, hdr.Name)
		if !strings.HasPrefix(target, filepath.Clean(dir)+string(os.PathSeparator)) {
			return fmt.Errorf("entry %q leaves the root", hdr.Name)
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, os.FileMode(hdr.Mode).Perm()); err != nil {
				return err
			}
		case tar.TypeSymlink:
			os.Remove(target)
			if err := os.Symlink(hdr.Linkname, target); err != nil {
				return err
			}
		case tar.TypeReg:
			os.Remove(target)
			f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(hdr.Mode).Perm())
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("entry %q: type %c not supported", hdr.Name, hdr.Typeflag)
		}
	}
	// Drain what follows the tar's end so the diff ID covers every byte.
	if _, err := io.Copy(h, zr); err != nil {
		return err
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != diffID {
		return fmt.Errorf("uncompressed layer has digest %s, config says %s", got, diffID)
	}
	return nil
}
