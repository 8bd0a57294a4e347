package client

import (
	"context"
	"io/fs"
	"path"
	"time"

	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/sdk"
)

// info is an fs.FileInfo of an inode's attributes.
type info struct {
	name string
	a    metaapi.Attr
}

func newInfo(p string, a metaapi.Attr) info { return info{name: path.Base(p), a: a} }

func (i info) Name() string { return i.name }
func (i info) Size() int64  { return i.a.Size }
func (i info) Mode() fs.FileMode {
	return typeMode(i.a.Type) | fs.FileMode(i.a.Mode&0o777) | extraMode(i.a.Mode)
}
func (i info) ModTime() time.Time { return time.Unix(0, i.a.Mtime) }
func (i info) IsDir() bool        { return i.a.Type == metaapi.TypeDir }

// Sys returns the file's owner and inode as a *Sys.
func (i info) Sys() any {
	return &Sys{Ino: uint64(i.a.Ino), UID: i.a.UID, GID: i.a.GID, Nlink: i.a.Nlink,
		Atime: time.Unix(0, i.a.Atime), Ctime: time.Unix(0, i.a.Ctime), Target: string(i.a.Target)}
}

// Sys is what a FileInfo's Sys method returns: what fs.FileInfo does not
// say of a Sluice inode.
type Sys struct {
	Ino          uint64
	UID, GID     uint32
	Nlink        uint32
	Atime, Ctime time.Time
	Target       string // a symbolic link's target
}

func typeMode(t metaapi.FileType) fs.FileMode {
	switch t {
	case metaapi.TypeDir:
		return fs.ModeDir
	case metaapi.TypeSymlink:
		return fs.ModeSymlink
	case metaapi.TypeFIFO:
		return fs.ModeNamedPipe
	case metaapi.TypeBlock:
		return fs.ModeDevice
	case metaapi.TypeChar:
		return fs.ModeDevice | fs.ModeCharDevice
	case metaapi.TypeSocket:
		return fs.ModeSocket
	}
	return 0
}

// extraMode maps setuid, setgid and sticky bits.
func extraMode(m uint32) fs.FileMode {
	var out fs.FileMode
	if m&0o4000 != 0 {
		out |= fs.ModeSetuid
	}
	if m&0o2000 != 0 {
		out |= fs.ModeSetgid
	}
	if m&0o1000 != 0 {
		out |= fs.ModeSticky
	}
	return out
}

// dirEntry is an fs.DirEntry of a directory listing.
type dirEntry struct {
	c   *sdk.Client
	ctx context.Context
	e   metaapi.Dirent
}

func (d dirEntry) Name() string      { return string(d.e.Name) }
func (d dirEntry) IsDir() bool       { return d.e.Type == metaapi.TypeDir }
func (d dirEntry) Type() fs.FileMode { return typeMode(d.e.Type) }

// Info asks meta for the entry's attributes now (the entry may have
// changed since the listing).
func (d dirEntry) Info() (fs.FileInfo, error) {
	a, err := d.c.GetAttr(d.ctx, d.e.Ino)
	if err != nil {
		return nil, err
	}
	return info{name: string(d.e.Name), a: a}, nil
}
