package meta

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// Check verifies the invariants that tie the stored state together, as
// fsck would: every entry points at a live inode of the recorded type;
// link counts match the entries (plus "." and ".." for directories); each
// directory has exactly one name and knows its parent; no inode is
// unreachable; chunks belong to files and have unique ids below the
// counter; the counters match what is stored. It reads a consistent view
// and returns every problem found (up to a limit), or nil.
func (s *Service) Check() error {
	var problems []error
	report := func(format string, args ...any) {
		if len(problems) < 50 {
			problems = append(problems, fmt.Errorf(format, args...))
		}
	}
	err := s.read(func(v view) error {
		inodes := map[ids.Ino]*inode{}
		err := scan(v.r, []byte{pInode}, []byte{pInode + 1}, func(k, val []byte) (bool, error) {
			in := new(inode)
			if err := json.Unmarshal(val, in); err != nil {
				return false, err
			}
			if key := ids.Ino(binary.BigEndian.Uint64(k[1:])); key != in.Ino {
				report("inode key %d holds inode %d", key, in.Ino)
			}
			inodes[in.Ino] = in
			return true, nil
		})
		if err != nil {
			return err
		}
		orphans := map[ids.Ino]bool{}
		err = scan(v.r, []byte{pOrphan}, []byte{pOrphan + 1}, func(k, val []byte) (bool, error) {
			ino := ids.Ino(binary.BigEndian.Uint64(k[1:]))
			orphans[ino] = true
			if in, ok := inodes[ino]; !ok || in.Type != metaapi.TypeFile {
				report("orphan record for missing or non-file inode %d", ino)
			}
			return true, nil
		})
		if err != nil {
			return err
		}
		err = scan(v.r, []byte{pXattr}, []byte{pXattr + 1}, func(k, val []byte) (bool, error) {
			if len(k) < 10 {
				report("malformed attribute key %q", k)
				return true, nil
			}
			if ino := ids.Ino(binary.BigEndian.Uint64(k[1:9])); inodes[ino] == nil {
				report("attribute %q of missing inode %d", k[9:], ino)
			}
			return true, nil
		})
		if err != nil {
			return err
		}
		refs := map[ids.Ino]int{}
		subdirs := map[ids.Ino]uint32{}
		err = scan(v.r, []byte{pDirent}, []byte{pDirent + 1}, func(k, val []byte) (bool, error) {
			parent := ids.Ino(binary.BigEndian.Uint64(k[1:9]))
			name := string(k[9:])
			d, err := decodeDirent(val)
			if err != nil {
				return false, err
			}
			if err := validName(name); err != nil {
				report("entry %q in %d: %v", name, parent, err)
			}
			p, ok := inodes[parent]
			if !ok || !p.isDir() {
				report("entry %q in %d: parent missing or not a directory", name, parent)
			}
			child, ok := inodes[d.Ino]
			if !ok {
				report("entry %q in %d points at missing inode %d", name, parent, d.Ino)
				return true, nil
			}
			if child.Type != d.Type {
				report("entry %q in %d says %s, inode %d is a %s", name, parent, d.Type, d.Ino, child.Type)
			}
			refs[d.Ino]++
			if child.isDir() {
				subdirs[parent]++
				if child.Parent != parent {
					report("directory %d named %q in %d records parent %d", d.Ino, name, parent, child.Parent)
				}
			}
			return true, nil
		})
		if err != nil {
			return err
		}
		var files, dirs int64
		var maxIno ids.Ino
		for ino, in := range inodes {
			maxIno = max(maxIno, ino)
			if in.isDir() {
				dirs++
				if want := 2 + subdirs[ino]; in.Nlink != want {
					report("directory %d has nlink %d, want %d", ino, in.Nlink, want)
				}
				wantRefs := 1
				if ino == ids.RootIno {
					wantRefs = 0
					if in.Parent != ids.RootIno {
						report("root's parent is %d", in.Parent)
					}
				}
				if refs[ino] != wantRefs {
					report("directory %d has %d names, want %d", ino, refs[ino], wantRefs)
				}
			} else {
				files++
				if refs[ino] == 0 && !(orphans[ino] && in.Nlink == 0) {
					report("%s %d is unreachable", in.Type, ino)
				}
				if int(in.Nlink) != refs[ino] {
					report("%s %d has nlink %d but %d names", in.Type, ino, in.Nlink, refs[ino])
				}
				if in.Type == metaapi.TypeFile && (in.Policy == nil || in.ChunkSize <= 0) {
					report("file %d has no policy or chunk size", ino)
				}
			}
		}
		if _, ok := inodes[ids.RootIno]; !ok {
			report("no root directory")
		}
		var chunks int64
		chunkIDs := map[ids.ChunkID]bool{}
		err = scan(v.r, []byte{pChunk}, []byte{pChunk + 1}, func(k, val []byte) (bool, error) {
			ino := ids.Ino(binary.BigEndian.Uint64(k[1:9]))
			index := int64(binary.BigEndian.Uint64(k[9:17]))
			var c chunkRec
			if err := json.Unmarshal(val, &c); err != nil {
				return false, err
			}
			chunks++
			in, ok := inodes[ino]
			if !ok || in.Type != metaapi.TypeFile {
				report("chunk %v (index %d) belongs to missing or non-file inode %d", c.ID, index, ino)
			}
			if chunkIDs[c.ID] {
				report("chunk id %v used twice", c.ID)
			}
			chunkIDs[c.ID] = true
			if raw, found, err := getRaw(v.r, chunkIDKey(c.ID)); err != nil {
				return false, err
			} else if ref, err := decodeChunkRef(raw); !found || err != nil || ref != (chunkRef{ino, index}) {
				report("chunk %v (index %d of inode %d) is not indexed by id (found=%v, %+v, %v)", c.ID, index, ino, found, ref, err)
			}
			if c.ID == 0 || c.ID >= s.ctr.NextChunk {
				report("chunk id %v not below the counter %v", c.ID, s.ctr.NextChunk)
			}
			if len(c.Nodes) == 0 {
				report("chunk %v has no replicas", c.ID)
			}
			return true, nil
		})
		if err != nil {
			return err
		}
		var indexed int64
		err = scan(v.r, []byte{pChunkID}, []byte{pChunkID + 1}, func(k, _ []byte) (bool, error) {
			indexed++
			if len(k) != 9 || !chunkIDs[ids.ChunkID(beUint64(k[1:]))] {
				report("chunk id index entry %x names no chunk record", k)
			}
			return true, nil
		})
		if err != nil {
			return err
		}
		if indexed != chunks {
			report("%d chunk id index entries for %d chunk records", indexed, chunks)
		}
		if files != s.ctr.Files || dirs != s.ctr.Dirs || chunks != s.ctr.Chunks {
			report("counters say %d files, %d dirs, %d chunks; found %d, %d, %d",
				s.ctr.Files, s.ctr.Dirs, s.ctr.Chunks, files, dirs, chunks)
		}
		if maxIno >= s.ctr.NextIno {
			report("inode %d not below the counter %d", maxIno, s.ctr.NextIno)
		}
		checkLocks(v, report)
		for id := range s.nodes {
			if id >= s.ctr.NextNode {
				report("node %d not below the counter %d", id, s.ctr.NextNode)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return errors.Join(problems...)
}

// checkLocks verifies the lock records agree with their indexes: each
// session's count is its number of locks, and a session is indexed on
// exactly the files it holds locks on. (Locks on a removed file stay
// until their session ends: harmless, its inode number is never reused.)
func checkLocks(v view, report func(string, ...any)) {
	perSession := map[uint64]int64{}
	held := map[[2]uint64]bool{}
	err := scan(v.r, []byte{pLock}, []byte{pLock + 1}, func(k, val []byte) (bool, error) {
		if len(k) != 34 || len(val) != 13 || val[8] < 1 || val[8] > 2 || k[25] > kindFlock || beUint64(k[26:]) > beUint64(val) {
			report("malformed lock record %x: %x", k, val)
			return true, nil
		}
		perSession[beUint64(k[9:])]++
		held[[2]uint64{beUint64(k[9:]), beUint64(k[1:])}] = true
		return true, nil
	})
	if err == nil {
		err = scan(v.r, []byte{pLockIndex}, []byte{pLockIndex + 1}, func(k, _ []byte) (bool, error) {
			if len(k) != 17 {
				report("malformed lock index %x", k)
				return true, nil
			}
			key := [2]uint64{beUint64(k[1:]), beUint64(k[9:])}
			if !held[key] {
				report("lock index %x names no lock", k)
			}
			delete(held, key)
			return true, nil
		})
	}
	for key := range held {
		report("session %x holds locks on inode %d but is not indexed there", key[0], key[1])
	}
	if err == nil {
		err = scan(v.r, []byte{pLockSess}, []byte{pLockSess + 1}, func(k, _ []byte) (bool, error) {
			rec, _, err := loadLockSess(v.r, beUint64(k[1:]))
			if err != nil {
				report("lock session %x: %v", k, err)
			} else if n := perSession[beUint64(k[1:])]; rec.locks != n {
				report("lock session %x counts %d locks, holds %d", k[1:], rec.locks, n)
			}
			delete(perSession, beUint64(k[1:]))
			return true, nil
		})
	}
	for sess, n := range perSession {
		report("%d locks of session %x, which has no record", n, sess)
	}
	if err != nil {
		report("reading locks: %v", err)
	}
}
