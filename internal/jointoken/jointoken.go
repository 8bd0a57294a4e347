// Package jointoken is the text of a join token: what an operator hands
// a new storage node so it can join the cluster. A token is
//
//	SJ1-<id: 16 hex>-<secret: 32 hex>-<CA pin: 64 hex>
//
// The id names the token in meta's store (which keeps only a hash of
// the secret); the secret proves the bearer was given the token; the
// pin is the SHA-256 of the cluster CA certificate, so the node can
// verify it reached the cluster's meta before it sends anything or
// trusts what comes back (as kubeadm's discovery hash does).
package jointoken

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"
)

const prefix = "SJ1-"

// Token is a parsed join token.
type Token struct {
	ID     uint64
	Secret [16]byte
	Pin    string // "sha256:<hex>" of the CA certificate (pki.Fingerprint)
}

// New returns a new random token pinning the CA fingerprint pin.
func New(pin string) (Token, error) {
	t := Token{Pin: pin}
	if !strings.HasPrefix(pin, "sha256:") || len(pin) != len("sha256:")+64 {
		return t, fmt.Errorf("join token: bad CA pin %q", pin)
	}
	var b [8]byte
	rand.Read(b[:])
	rand.Read(t.Secret[:])
	t.ID = binary.BigEndian.Uint64(b[:]) | 1 // never 0
	return t, nil
}

// String is the token's text.
func (t Token) String() string {
	return fmt.Sprintf("%s%016x-%s-%s", prefix, t.ID, hex.EncodeToString(t.Secret[:]), strings.TrimPrefix(t.Pin, "sha256:"))
}

// Hash is what meta stores of the secret.
func (t Token) Hash() [32]byte { return sha256.Sum256(t.Secret[:]) }

// Parse reads a token's text.
func Parse(text string) (Token, error) {
	var t Token
	rest, ok := strings.CutPrefix(strings.TrimSpace(text), prefix)
	parts := strings.Split(rest, "-")
	if !ok || len(parts) != 3 || len(parts[0]) != 16 || len(parts[1]) != 32 || len(parts[2]) != 64 {
		return t, fmt.Errorf("not a join token (want %s<16 hex>-<32 hex>-<64 hex>, from `sluice join-token`)", prefix)
	}
	id, err := hex.DecodeString(parts[0])
	if err != nil {
		return t, fmt.Errorf("join token id: %w", err)
	}
	t.ID = binary.BigEndian.Uint64(id)
	if _, err := hex.Decode(t.Secret[:], []byte(parts[1])); err != nil {
		return t, fmt.Errorf("join token secret: %w", err)
	}
	if _, err := hex.DecodeString(parts[2]); err != nil {
		return t, fmt.Errorf("join token CA pin: %w", err)
	}
	t.Pin = "sha256:" + strings.ToLower(parts[2])
	return t, nil
}
