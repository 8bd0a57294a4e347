// Package rangelock is the decision logic of advisory file locks as Linux
// has them: POSIX record locks (fcntl: byte ranges, shared or exclusive,
// per owner) and BSD locks (flock: the whole file). It decides which held
// lock a request conflicts with and what an owner holds after locking or
// unlocking a range. It is pure: meta stores the locks and mounts ask.
package rangelock

// Type is what a request sets a range to.
type Type uint8

const (
	Unlock Type = iota
	Read        // shared
	Write       // exclusive
)

// Owner identifies who holds a lock: a session (one mount) and the owner
// id the kernel gave (a process's file table for POSIX locks, an open
// file description for BSD and OFD locks).
type Owner struct {
	Session uint64
	ID      uint64
}

// Lock is a held lock on the inclusive byte range [Start, End]. End is
// math.MaxInt64 (the kernel's OFFSET_MAX) or above for "to end of file".
type Lock struct {
	Owner Owner
	Start uint64
	End   uint64
	Type  Type   // Read or Write
	Pid   uint32 // of the process that set it, as the kernel reported
}

func overlaps(l Lock, start, end uint64) bool { return l.Start <= end && start <= l.End }

// Conflict returns a lock in held that keeps owner from setting
// [start, end] to typ: another owner's lock over part of the range where
// either lock is exclusive. Unlocking never conflicts.
func Conflict(held []Lock, owner Owner, start, end uint64, typ Type) (Lock, bool) {
	if typ == Unlock {
		return Lock{}, false
	}
	for _, l := range held {
		if l.Owner != owner && overlaps(l, start, end) && (typ == Write || l.Type == Write) {
			return l, true
		}
	}
	return Lock{}, false
}

// Apply returns an owner's locks (mine, sorted by Start and not
// overlapping, as Apply returns them) after setting [start, end] to typ:
// what it held inside the range is replaced, a lock reaching past either
// end is split, and neighbouring locks of one type are merged, as POSIX
// does. mine is not modified.
func Apply(mine []Lock, owner Owner, start, end uint64, typ Type, pid uint32) []Lock {
	out := make([]Lock, 0, len(mine)+2)
	for _, l := range mine {
		if !overlaps(l, start, end) {
			out = append(out, l)
			continue
		}
		if l.Start < start {
			left := l
			left.End = start - 1
			out = append(out, left)
		}
		if l.End > end {
			right := l
			right.Start = end + 1
			out = append(out, right)
		}
	}
	if typ != Unlock {
		out = append(out, Lock{Owner: owner, Start: start, End: end, Type: typ, Pid: pid})
	}
	sortByStart(out)
	return merge(out)
}

// sortByStart is an insertion sort: an owner holds few locks on one file.
func sortByStart(ls []Lock) {
	for i := 1; i < len(ls); i++ {
		for j := i; j > 0 && ls[j].Start < ls[j-1].Start; j-- {
			ls[j], ls[j-1] = ls[j-1], ls[j]
		}
	}
}

// merge joins touching locks of one type (the input does not overlap).
func merge(ls []Lock) []Lock {
	out := ls[:0]
	for _, l := range ls {
		if n := len(out); n > 0 {
			p := &out[n-1]
			if p.Type == l.Type && p.End != ^uint64(0) && p.End+1 == l.Start {
				p.End = l.End
				p.Pid = l.Pid
				continue
			}
		}
		out = append(out, l)
	}
	return out
}
