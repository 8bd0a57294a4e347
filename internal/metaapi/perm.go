package metaapi

// Access bits, as in access(2) (CreateReq.Open).
const (
	MayExec  = 1
	MayWrite = 2
	MayRead  = 4
)

// InGroup reports whether who belongs to group gid.
func (who Who) InGroup(gid uint32) bool {
	if who.GID == gid {
		return true
	}
	for _, g := range who.GIDs {
		if g == gid {
			return true
		}
	}
	return false
}

// Allows applies the standard Unix check to an inode with attributes a:
// the owner's, else the group's, else others' triplet must contain every
// wanted bit (MayRead, MayWrite, MayExec). Root bypasses read and write
// checks, and execute checks on directories; it may execute a regular
// file only if some execute bit is set. Meta enforces it; front ends
// that must check a call themselves (the NFS gateway) use the same.
func (a *Attr) Allows(who Who, want uint32) bool {
	if who.UID == 0 {
		return want&MayExec == 0 || a.Type == TypeDir || a.Mode&0o111 != 0
	}
	var bits uint32
	switch {
	case who.UID == a.UID:
		bits = a.Mode >> 6
	case who.InGroup(a.GID):
		bits = a.Mode >> 3
	default:
		bits = a.Mode
	}
	return bits&7&want == want
}

// AllowsData is Allows for reading and writing a file's data (and
// truncating it): its owner always may, whatever the mode. POSIX checks
// the mode when a file is opened, not at each read and write, and a file
// may be written through the descriptor that created it whatever mode it
// was given (tar and cp make read-only files so; ftruncate(2) works on
// them). Meta and the NFS gateway see no descriptors: on a mount the
// kernel checks each open against the mode before any data moves; NFS,
// which has no opens, lets the owner through as knfsd does, and clients
// check opens with ACCESS, which reports the mode. Anyone else is held
// to the mode on every call.
func (a *Attr) AllowsData(who Who, want uint32) bool {
	return who.UID == a.UID || a.Allows(who, want)
}

// KillSuidgid is mode with the privileges a write, a truncation or a
// change of owner by an unprivileged process drops, as Linux drops them:
// set-user-ID, and set-group-ID where it means "run as the group"
// (group-executable; without it, it marks mandatory locking). A
// directory keeps both: its bits mean something else.
func KillSuidgid(t FileType, mode uint32) uint32 {
	if t == TypeDir {
		return mode
	}
	mode &^= 0o4000
	if mode&0o010 != 0 {
		mode &^= 0o2000
	}
	return mode
}
