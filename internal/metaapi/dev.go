package metaapi

// IsDevice reports whether t is a block or character device.
func (t FileType) IsDevice() bool { return t == TypeBlock || t == TypeChar }

// Device numbers are Linux's: a major of 12 bits and a minor of 20, kept
// as glibc's dev_t encodes them (what stat(2) reports as st_rdev).
const (
	MaxDevMajor = 1<<12 - 1
	MaxDevMinor = 1<<20 - 1
)

// Mkdev encodes a device number as glibc's makedev does.
func Mkdev(major, minor uint32) uint64 {
	return uint64(major&0xfff)<<8 | uint64(major&^0xfff)<<32 | uint64(minor&0xff) | uint64(minor&^0xff)<<12
}

// DevMajor and DevMinor decode a device number made by Mkdev.
func DevMajor(dev uint64) uint32 { return uint32(dev>>8&0xfff | dev>>32&^0xfff) }
func DevMinor(dev uint64) uint32 { return uint32(dev&0xff | dev>>12&^0xff) }
