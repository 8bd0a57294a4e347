package meta

import (
	"strings"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// maxSymlinks is how many symbolic links one resolution may follow, as
// Linux's MAXSYMLINKS.
const maxSymlinks = 40

// validName checks one directory-entry name: non-empty, not "." or "..",
// at most MaxNameLen bytes, no '/' or NUL.
func validName(name string) error {
	switch {
	case name == "":
		return metaapi.Errorf(metaapi.EINVAL, "empty file name")
	case name == "." || name == "..":
		return metaapi.Errorf(metaapi.EINVAL, "file name %q is reserved", name)
	case len(name) > metaapi.MaxNameLen:
		return metaapi.Errorf(metaapi.ENAMETOOLONG, "file name of %d bytes, at most %d allowed", len(name), metaapi.MaxNameLen)
	case strings.IndexByte(name, '/') >= 0:
		return metaapi.Errorf(metaapi.EINVAL, "file name %q contains '/'", name)
	case strings.IndexByte(name, 0) >= 0:
		return metaapi.Errorf(metaapi.EINVAL, "file name %q contains NUL", name)
	}
	return nil
}

// validTarget checks a symbolic link's target.
func validTarget(t string) error {
	switch {
	case t == "":
		return metaapi.Errorf(metaapi.EINVAL, "empty symlink target")
	case len(t) > metaapi.MaxPathLen:
		return metaapi.Errorf(metaapi.ENAMETOOLONG, "symlink target of %d bytes, at most %d allowed", len(t), metaapi.MaxPathLen)
	case strings.IndexByte(t, 0) >= 0:
		return metaapi.Errorf(metaapi.EINVAL, "symlink target contains NUL")
	}
	return nil
}

// resolve walks an absolute path from the root, component by component,
// as POSIX path resolution does: empty components and "." are skipped,
// ".." goes to the parent (the root's parent is the root), symbolic links
// in the middle of the path are always followed (relative targets from the
// directory holding the link, absolute ones from the root), and one in the
// last component only if follow is set or the path ends in '/'. A trailing
// '/' also requires the result to be a directory. "" and "/" are the root:
// top, the directory the caller is confined to (ids.RootIno for the whole
// namespace), which ".." does not leave and absolute symlinks start from.
func resolve(r ns, path string, follow bool, top ids.Ino) (*inode, error) {
	if len(path) > metaapi.MaxPathLen {
		return nil, metaapi.Errorf(metaapi.ENAMETOOLONG, "path of %d bytes, at most %d allowed", len(path), metaapi.MaxPathLen)
	}
	if top == 0 {
		top = ids.RootIno
	}
	root, err := r.inode(top)
	if err != nil {
		return nil, err
	}
	if !root.isDir() {
		return nil, metaapi.Errorf(metaapi.ENOTDIR, "resolving %q: the root %d is not a directory", path, top)
	}
	if path == "" {
		return root, nil
	}
	if path[0] != '/' {
		return nil, metaapi.Errorf(metaapi.EINVAL, "path %q is not absolute", path)
	}
	if strings.IndexByte(path, 0) >= 0 {
		return nil, metaapi.Errorf(metaapi.EINVAL, "path %q contains NUL", path)
	}
	cur := root
	rest := path
	links := 0
	wantDir := false
	for {
		rest = strings.TrimLeft(rest, "/")
		if rest == "" {
			break
		}
		comp, after, slash := strings.Cut(rest, "/")
		rest = after
		wantDir = slash
		if !cur.isDir() {
			return nil, metaapi.Errorf(metaapi.ENOTDIR, "resolving %q: inode %d is not a directory", path, cur.Ino)
		}
		if len(comp) > metaapi.MaxNameLen {
			return nil, metaapi.Errorf(metaapi.ENAMETOOLONG, "resolving %q: component of %d bytes, at most %d allowed", path, len(comp), metaapi.MaxNameLen)
		}
		switch comp {
		case ".":
			continue
		case "..":
			if cur.Ino == top {
				continue
			}
			if cur, err = r.inode(cur.Parent); err != nil {
				return nil, err
			}
			continue
		}
		d, found, err := r.entry(cur.Ino, comp)
		if err != nil {
			return nil, err
		}
		if !found {
			return nil, metaapi.Errorf(metaapi.ENOENT, "resolving %q: no entry %q in directory %d", path, comp, cur.Ino)
		}
		child, err := r.inode(d.Ino)
		if err != nil {
			return nil, err
		}
		if child.Type == metaapi.TypeSymlink && (slash || follow) {
			links++
			if links > maxSymlinks {
				return nil, metaapi.Errorf(metaapi.ELOOP, "resolving %q: more than %d symbolic links", path, maxSymlinks)
			}
			target := string(child.Target)
			if strings.HasPrefix(target, "/") {
				cur = root
			}
			if slash {
				rest = target + "/" + rest
			} else {
				rest = target
			}
			continue
		}
		cur = child
	}
	if wantDir && !cur.isDir() {
		return nil, metaapi.Errorf(metaapi.ENOTDIR, "resolving %q: inode %d is not a directory", path, cur.Ino)
	}
	return cur, nil
}
