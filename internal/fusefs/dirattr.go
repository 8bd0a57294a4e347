package fusefs

import (
	"sync"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// dirAttrs remembers the attributes meta returned for directories this
// mount just changed. The kernel drops a directory's cached attributes
// after each create, unlink or rename in it, and (default_permissions)
// asks for them again at the next operation there, to check permissions:
// one meta round trip per file created. Meta's reply to the change
// already says what they are, so the mount answers from it — for at most
// the attribute timeout, the staleness the kernel's own cache allows.
type dirAttrs struct {
	ttl time.Duration
	now func() time.Time

	mu sync.Mutex
	m  map[ids.Ino]dirAttr
}

type dirAttr struct {
	a  metaapi.Attr
	at time.Time
}

// maxDirAttrs bounds the map; past it, it starts over.
const maxDirAttrs = 4096

// note records directories as meta just returned them.
func (d *dirAttrs) note(dirs []metaapi.Attr) {
	if d.ttl <= 0 || len(dirs) == 0 {
		return
	}
	now := d.now()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.m == nil || len(d.m) >= maxDirAttrs {
		d.m = make(map[ids.Ino]dirAttr)
	}
	for _, a := range dirs {
		if a.Type == metaapi.TypeDir {
			d.m[a.Ino] = dirAttr{a, now}
		}
	}
}

// get returns ino's attributes if noted within the timeout, and how much
// of the timeout is left: the kernel may keep them only that long, so
// that nothing is believed longer than the timeout after meta said it.
func (d *dirAttrs) get(ino ids.Ino) (metaapi.Attr, time.Duration, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.m[ino]
	if !ok {
		return metaapi.Attr{}, 0, false
	}
	left := d.ttl - d.now().Sub(e.at)
	if left <= 0 {
		delete(d.m, ino)
		return metaapi.Attr{}, 0, false
	}
	return e.a, left, true
}

// forget drops ino: its attributes are changing in a way not noted (a
// chmod whose reply may be lost, an attribute set, a rename).
func (d *dirAttrs) forget(ino ids.Ino) {
	d.mu.Lock()
	delete(d.m, ino)
	d.mu.Unlock()
}
