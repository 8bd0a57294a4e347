package chaos

import (
	"path/filepath"
	"time"

	"github.com/sluicefs/sluice/internal/launch"
)

// start starts one `sluice` daemon: both its streams go to
// dir/name.log, and it is ready once it writes dir/name.ready.
func start(bin, dir, name string, args ...string) (*launch.Proc, error) {
	return launch.Start(launch.Spec{Name: name, Path: bin, Args: args,
		Log: filepath.Join(dir, name+".log"), ReadyFile: filepath.Join(dir, name+".ready"),
		KillWithParent: true}) // never outlive the run
}

// stopWait is how long a stopped daemon gets before it is killed.
const stopWait = 10 * time.Second
