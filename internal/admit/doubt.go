package admit

import "fmt"

// Doubt is a write the head replica aborted after some replica below it
// may have committed it: those replicas can be anywhere from version Base
// to Version, with the write (tag Tag) covering [Off, End). The head must
// never give a version in that span to another write — a replica that has
// it would refuse that write as stale while the others accept it, leaving
// two replicas at one version with different bytes. So until a write
// resolves the doubt, the head admits only:
//
//   - the same write again (same tag and range): it gets Version, and a
//     replica that already has it answers "already applied";
//   - a write covering [Off, End): it gets Version+1, and every replica,
//     at whatever version in [Base, Version] it is, ends with the same
//     bytes (the span's writes all lie inside this one's range).
//
// Either one committing clears the doubt.
type Doubt struct {
	Base    uint64 // the version the head holds; replicas may be at Base..Version
	Version uint64
	Tag     uint64
	Off     int64
	End     int64
}

// admit decides the version a head write of [off, end) with tag gets.
func (d Doubt) admit(off, end int64, tag uint64) (uint64, error) {
	switch {
	case tag != 0 && tag == d.Tag && off == d.Off && end == d.End:
		return d.Version, nil
	case off <= d.Off && end >= d.End:
		return d.Version + 1, nil
	}
	return 0, fmt.Errorf("a write of [%d, %d) as version %d may have reached only some replicas; "+
		"retry it, or write a range covering it: %w", d.Off, d.End, d.Version, ErrInDoubt)
}
