package meta

import (
	"fmt"
	"strings"

	"github.com/sluicefs/sluice/internal/metaapi"
)

// Mode bits beyond the rwx triplets.
const (
	modeSetuid = 0o4000
	modeSetgid = 0o2000
	modeSticky = 0o1000
	modePerm   = 0o7777
)

// Access bits, as in access(2).
const (
	mayExec  = metaapi.MayExec
	mayWrite = metaapi.MayWrite
	mayRead  = metaapi.MayRead
)

// maxLinks bounds the hard links of one inode (EMLINK beyond).
const maxLinks = 65000

// access returns EACCES unless who has the wanted access to in.
func access(in *inode, who metaapi.Who, want uint32) error {
	if in.Allows(who, want) {
		return nil
	}
	return metaapi.Errorf(metaapi.EACCES, "permission denied: uid %d needs %s on %s %d (mode %04o, owner %d:%d)",
		who.UID, accessString(want), in.Type, in.Ino, in.Mode, in.UID, in.GID)
}

func accessString(want uint32) string {
	var parts []string
	if want&mayRead != 0 {
		parts = append(parts, "read")
	}
	if want&mayWrite != 0 {
		parts = append(parts, "write")
	}
	if want&mayExec != 0 {
		parts = append(parts, "search/execute")
	}
	return strings.Join(parts, "+")
}

// dataAccess is access for reading and writing a file's data (see
// metaapi.Attr.AllowsData: its owner always may).
func dataAccess(in *inode, who metaapi.Who, want uint32) error {
	if in.AllowsData(who, want) {
		return nil
	}
	return access(in, who, want)
}

// isOwner reports whether who owns in or is root (the test chmod, chown
// and utimes use).
func isOwner(in *inode, who metaapi.Who) bool { return who.UID == 0 || who.UID == in.UID }

// checkSticky enforces the sticky bit of dir on removing or replacing
// victim: only the owner of the victim or of the directory, or root, may.
// Like Linux it fails with EPERM.
func checkSticky(dir, victim *inode, who metaapi.Who) error {
	if dir.Mode&modeSticky == 0 || who.UID == 0 || who.UID == dir.UID || who.UID == victim.UID {
		return nil
	}
	return metaapi.Errorf(metaapi.EPERM, "sticky directory %d: uid %d owns neither it nor %s %d", dir.Ino, who.UID, victim.Type, victim.Ino)
}

func eperm(format string, args ...any) error {
	return metaapi.Errorf(metaapi.EPERM, "operation not permitted: %s", fmt.Sprintf(format, args...))
}
