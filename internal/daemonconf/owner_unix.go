//go:build unix

package daemonconf

import (
	"os"
	"syscall"
)

// owner is the uid that owns the file st describes.
func owner(st os.FileInfo) (uint32, bool) {
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return sys.Uid, true
}
