package main

import (
	"fmt"
	"strconv"
	"strings"
)

// sizeFlag is a flag holding a byte count written as a number with an
// optional binary suffix: 4096, 4KiB, 64MiB, 1GiB.
type sizeFlag int64

func (s *sizeFlag) String() string {
	v := int64(*s)
	for _, u := range []struct {
		suffix string
		shift  uint
	}{{"GiB", 30}, {"MiB", 20}, {"KiB", 10}} {
		if v != 0 && v%(1<<u.shift) == 0 {
			return strconv.FormatInt(v>>u.shift, 10) + u.suffix
		}
	}
	return strconv.FormatInt(v, 10)
}

func (s *sizeFlag) Set(text string) error {
	num, shift := text, uint(0)
	for suffix, sh := range map[string]uint{"KiB": 10, "MiB": 20, "GiB": 30} {
		if n, ok := strings.CutSuffix(text, suffix); ok {
			num, shift = n, sh
		}
	}
	v, err := strconv.ParseInt(num, 10, 64)
	if err != nil || v < 0 || v > (1<<62)>>shift {
		return fmt.Errorf("%q is not a size (bytes, or a number with KiB, MiB or GiB)", text)
	}
	*s = sizeFlag(v << shift)
	return nil
}

func (s *sizeFlag) Type() string { return "size" }
