package metaapi

import (
	"testing"

	"golang.org/x/sys/unix"
)

// Device numbers are encoded as glibc encodes dev_t, so st_rdev, FUSE's
// 32-bit rdev and NFS's specdata3 all agree with what is stored.
func TestMkdevMatchesGlibc(t *testing.T) {
	for _, d := range [][2]uint32{{0, 0}, {1, 3}, {8, 17}, {255, 255}, {256, 256}, {MaxDevMajor, MaxDevMinor}, {1 << 20, 1 << 31}, {^uint32(0), ^uint32(0)}} {
		dev := Mkdev(d[0], d[1])
		if want := unix.Mkdev(d[0], d[1]); dev != want {
			t.Errorf("Mkdev(%d, %d) = %#x, want %#x", d[0], d[1], dev, want)
		}
		if DevMajor(dev) != d[0] || DevMinor(dev) != d[1] {
			t.Errorf("%#x decodes to %d:%d, want %d:%d", dev, DevMajor(dev), DevMinor(dev), d[0], d[1])
		}
		if d[0] <= MaxDevMajor && d[1] <= MaxDevMinor && dev>>32 != 0 {
			t.Errorf("Linux device %d:%d does not fit FUSE's 32 bits: %#x", d[0], d[1], dev)
		}
	}
}

func TestKillSuidgid(t *testing.T) {
	for _, tc := range []struct {
		typ        FileType
		mode, want uint32
	}{
		{TypeFile, 0o6777, 0o777},
		{TypeFile, 0o6767, 0o2767}, // setgid without group execute: mandatory locking, kept
		{TypeFile, 0o4700, 0o700},
		{TypeFile, 0o1777, 0o1777},
		{TypeFIFO, 0o6750, 0o750},
		{TypeChar, 0o4644, 0o644},
		{TypeDir, 0o6777, 0o6777},
	} {
		if got := KillSuidgid(tc.typ, tc.mode); got != tc.want {
			t.Errorf("%s %o: %o, want %o", tc.typ, tc.mode, got, tc.want)
		}
	}
}

func TestAllowsData(t *testing.T) {
	a := Attr{Type: TypeFile, Mode: 0o404, UID: 10, GID: 20}
	for _, tc := range []struct {
		who  Who
		want uint32
		ok   bool
	}{
		{Who{UID: 10, GID: 99}, MayWrite, true}, // the owner, whatever the mode
		{Who{UID: 10, GID: 99}, MayRead | MayWrite, true},
		{Who{UID: 11, GID: 20}, MayRead, false}, // the group has nothing
		{Who{UID: 11, GID: 99}, MayRead, true},  // others may read
		{Who{UID: 11, GID: 99}, MayWrite, false},
		{Who{UID: 0}, MayWrite, true},
	} {
		if got := a.AllowsData(tc.who, tc.want); got != tc.ok {
			t.Errorf("%+v wants %d: %v, want %v", tc.who, tc.want, got, tc.ok)
		}
	}
}
