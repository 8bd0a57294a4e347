package node

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestDomainMustBeText: a failure domain that is not UTF-8 is refused at
// start; sent to meta, its odd bytes would become U+FFFD, and two
// distinct domains one.
func TestDomainMustBeText(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // without the check, it would wait for meta
	defer cancel()
	n, err := Start(ctx, Options{DataDir: t.TempDir(), MetaAddr: "127.0.0.1:1", Domain: "rack\xe9"})
	if err == nil {
		n.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "not UTF-8") {
		t.Fatalf("Start with domain rack\\xe9: %v, want a UTF-8 error", err)
	}
}
