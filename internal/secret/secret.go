// Package secret manages the cluster secret: the 32 random bytes meta
// creates on first start and keeps to itself (storage nodes no longer
// receive it). Keys derived from it with HMAC-SHA256 and a purpose label
// are what meta's own credentials rest on; capability and forward-seal
// keys were derived from it by earlier versions, and meta derives them
// now only to keep accepting, until they expire, what those versions
// minted (docs/capkeys.md).
package secret

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
)

// Size is the length of a cluster secret in bytes.
const Size = 32

// Secret is a loaded cluster secret.
type Secret struct{ b [Size]byte }

// Generate returns a new random secret.
func Generate() (Secret, error) {
	var s Secret
	if _, err := rand.Read(s.b[:]); err != nil {
		return s, fmt.Errorf("generating cluster secret: %w", err)
	}
	return s, nil
}

// Parse decodes the hex text form written by Save.
func Parse(text string) (Secret, error) {
	var s Secret
	raw, err := hex.DecodeString(strings.TrimSpace(text))
	if err != nil {
		return s, fmt.Errorf("cluster secret is not hex: %w", err)
	}
	if len(raw) != Size {
		return s, fmt.Errorf("cluster secret has %d bytes, want %d", len(raw), Size)
	}
	copy(s.b[:], raw)
	return s, nil
}

// Load reads a secret file.
func Load(path string) (Secret, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return Secret{}, fmt.Errorf("reading cluster secret: %w", err)
	}
	s, err := Parse(string(raw))
	if err != nil {
		return s, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// LoadOrCreate loads the secret at path, creating it (mode 0600) if the
// file does not exist.
func LoadOrCreate(path string) (Secret, error) {
	s, err := Load(path)
	if err == nil {
		return s, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return s, err
	}
	if s, err = Generate(); err != nil {
		return s, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return s, fmt.Errorf("creating cluster secret: %w", err)
	}
	if _, err := f.WriteString(s.String() + "\n"); err != nil {
		f.Close()
		return s, fmt.Errorf("writing cluster secret: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return s, fmt.Errorf("syncing cluster secret: %w", err)
	}
	return s, f.Close()
}

// String returns the hex form. Callers must not log it.
func (s Secret) String() string { return hex.EncodeToString(s.b[:]) }

// Derive returns a 32-byte key for purpose and id.
func (s Secret) Derive(purpose string, id uint64) []byte {
	m := hmac.New(sha256.New, s.b[:])
	m.Write([]byte("sluice/v1/"))
	m.Write([]byte(purpose))
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], id)
	m.Write(n[:])
	return m.Sum(nil)
}

// Purposes of derived keys.
const (
	PurposeCapability = "capability-key"
	PurposeNodeToken  = "node-token"
	PurposeClient     = "client-credential"
	PurposeForward    = "forward-seal"
)

// NodeToken is what a storage node presents to meta to prove it holds the
// cluster secret.
func (s Secret) NodeToken() string { return hex.EncodeToString(s.Derive(PurposeNodeToken, 0)) }

// ClientCredential is the credential meta issues in client.conf for a
// client id.
func (s Secret) ClientCredential(client uint64) string {
	return hex.EncodeToString(s.Derive(PurposeClient, client))
}

// Equal compares two tokens in constant time.
func Equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }
