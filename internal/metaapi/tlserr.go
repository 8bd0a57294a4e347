package metaapi

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"

	"github.com/sluicefs/sluice/internal/pki"
)

// TLSError is a failure to set up TLS with meta that asking again cannot
// fix: a certificate from another CA, one that does not name the
// address dialled, a server that does not speak TLS, or meta refusing
// this side's certificate. Calls failing with it are not retried.
type TLSError struct {
	Reason string
	Err    error
}

func (e *TLSError) Error() string {
	if e.Err == nil {
		return "TLS: " + e.Reason
	}
	return fmt.Sprintf("TLS: %s: %v", e.Reason, e.Err)
}

func (e *TLSError) Unwrap() error { return e.Err }

// explainTLS names the cause of a TLS failure in err, if it is one.
func explainTLS(err error) error {
	var (
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		record   tls.RecordHeaderError
	)
	switch {
	case errors.Is(err, pki.ErrPin):
		return &TLSError{Reason: pki.ErrPin.Error()}
	case errors.As(err, &unknown):
		return &TLSError{Reason: "meta's certificate is not signed by the cluster CA this side trusts (a client config of another cluster, or not the meta meant)", Err: err}
	case errors.As(err, &hostname):
		return &TLSError{Reason: fmt.Sprintf("meta's certificate does not name %s (start meta with --tls-san %s)", hostname.Host, hostname.Host), Err: err}
	case errors.As(err, &invalid):
		return &TLSError{Reason: "meta's certificate is not valid", Err: err}
	case errors.As(err, &record), strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		return &TLSError{Reason: "the server does not speak TLS (plain HTTP, or not a Sluice meta of this version)", Err: err}
	case strings.Contains(err.Error(), "remote error: tls:"):
		return &TLSError{Reason: "meta refused the TLS handshake (a node certificate of another cluster?)", Err: err}
	}
	return err
}
