package nfs3

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/sdk"
)

// TestStatusOf: meta's answers map to their nfsstat3; a storage node's
// failure is EIO; meta out of reach (a transport error past the SDK's
// retries) or busy is JUKEBOX, which clients retry.
func TestStatusOf(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want Status
	}{
		{nil, OK},
		{metaapi.Errorf(metaapi.ENOENT, "x"), ErrNoent},
		{fmt.Errorf("wrapped: %w", metaapi.Errorf(metaapi.ENOTEMPTY, "x")), ErrNotempty},
		{metaapi.Errorf(metaapi.EAGAIN, "repairing"), ErrJukebox},
		{metaapi.Errorf(metaapi.EIO, "x"), ErrIO},
		{&sdk.NodeError{Op: "read", Addr: "n1", Err: errors.New("reset")}, ErrIO},
		{errors.New("meta GetAttr: dial tcp 127.0.0.1:7700: connect: connection refused"), ErrJukebox},
		{context.Canceled, ErrIO},
		{errBadHandle, ErrBadhandle},
	} {
		if got := statusOf(tc.err); got != tc.want {
			t.Errorf("statusOf(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}
