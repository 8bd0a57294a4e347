// Package readyfile is the small JSON file a Sluice daemon (meta, node,
// nfs, mount, up) writes once it serves, when given --ready-file: what
// a program that started it needs (addresses, node ids, the client
// configuration's path), so it does not have to parse the lines the
// daemon prints for people. The file appears whole (written beside its
// final name and renamed), so a reader that sees it can parse it.
package readyfile

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// MaxBytes bounds a ready file a reader accepts: it is a few addresses.
const MaxBytes = 1 << 20

// Info is what a ready file holds. A daemon fills what it has.
type Info struct {
	PID int `json:"pid"`
	// Meta is the address clients and nodes reach meta at (meta, up).
	Meta string `json:"meta,omitempty"`
	// MetaListen is the address meta listens on (meta).
	MetaListen string `json:"meta_listen,omitempty"`
	// Conf is the client configuration meta wrote (meta, up).
	Conf string `json:"conf,omitempty"`
	// Secret is the cluster secret's file (meta).
	Secret string `json:"secret,omitempty"`
	// Nodes are the storage nodes (node: itself; up: all of them).
	Nodes []Node `json:"nodes,omitempty"`
	// NFS and NFSFabric are the gateway's addresses (nfs).
	NFS       string `json:"nfs,omitempty"`
	NFSFabric string `json:"nfs_fabric,omitempty"`
	// Mount is the directory mounted (mount, up --mount).
	Mount string `json:"mount,omitempty"`
}

// Node is one storage node.
type Node struct {
	ID   string `json:"id"`   // "n3"
	Addr string `json:"addr"` // its fabric address as registered with meta
}

// Write writes info to path atomically; a zero PID becomes this
// process's.
func Write(path string, info Info) error {
	if info.PID == 0 {
		info.PID = os.Getpid()
	}
	b, err := json.Marshal(info)
	if err != nil {
		return fmt.Errorf("ready file: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("writing ready file: %w", err)
	}
	_, err = tmp.Write(append(b, '\n'))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("writing ready file %s: %w", path, err)
	}
	return nil
}

// Read reads a ready file; os.ErrNotExist (wrapped) means not yet.
func Read(path string) (Info, error) {
	f, err := os.Open(path)
	if err != nil {
		return Info{}, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxBytes+1))
	if err != nil {
		return Info{}, fmt.Errorf("reading ready file %s: %w", path, err)
	}
	if len(b) > MaxBytes {
		return Info{}, fmt.Errorf("ready file %s: more than %d bytes", path, MaxBytes)
	}
	var info Info
	if err := json.Unmarshal(b, &info); err != nil {
		return Info{}, fmt.Errorf("parsing ready file %s: %w", path, err)
	}
	return info, nil
}
