package meta

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/pki"
)

// FuzzHTTP throws arbitrary bodies at every operation with a valid client
// or node credential: the service must answer every request with a JSON
// reply (never panic, never a 5xx for bad input) and its invariants must
// hold afterwards.
func FuzzHTTP(f *testing.F) {
	ops := []string{metaapi.OpResolve, metaapi.OpLookup, metaapi.OpGetAttr, metaapi.OpCreate, metaapi.OpLink,
		metaapi.OpRemove, metaapi.OpRename, metaapi.OpReaddir, metaapi.OpSetAttr, metaapi.OpSetPolicy,
		metaapi.OpGetPolicy, metaapi.OpLayout, metaapi.OpCommit, metaapi.OpDegraded, metaapi.OpListDeg, metaapi.OpStatus, metaapi.OpRegister, metaapi.OpHeartbeat,
		metaapi.OpRelease, metaapi.OpSetXattr, metaapi.OpGetXattr, metaapi.OpListXattr, metaapi.OpRmXattr,
		metaapi.OpLock, metaapi.OpLockSess, metaapi.OpInventory, metaapi.OpStrays, metaapi.OpJoin, metaapi.OpJoinToken}
	f.Add(uint8(3), []byte(`{"parent":1,"name":"a","type":"file","mode":420}`))
	f.Add(uint8(3), []byte(`{"parent":1,"name":"d","type":"dir","mode":493}`))
	f.Add(uint8(11), []byte(`{"ino":2,"off":0,"len":9223372036854775807,"write":true}`))
	f.Add(uint8(7), []byte(`{"ino":1,"limit":-5}`))
	f.Add(uint8(12), []byte(`{"ino":2,"size":-1,"chunks":[{"index":-3,"chunk":1,"version":1}]}`))
	f.Add(uint8(8), []byte(`{"ino":2,"size":1125899906842625}`))
	f.Add(uint8(14), []byte(`{"id":0,"addr":"127.0.0.1:1","capacity":-1}`))
	f.Add(uint8(6), []byte(`{"old_parent":1,"old_name":"d","new_parent":2,"new_name":"x"}`))
	f.Add(uint8(0), []byte(`{"path":"/a/../../b/./c//d"}`))
	f.Add(uint8(9), []byte(`{"ino":1,"policy":{"replicas":1000000,"strategy":"ring"}}`))
	f.Add(uint8(1), []byte("\x00\xff not json"))
	f.Add(uint8(20), []byte(`{"ino":1,"name":"user.a","value":"eA==","flags":1}`))
	f.Add(uint8(20), []byte(`{"ino":1,"name":"trusted.\u0000","value":null,"flags":3}`))
	f.Add(uint8(21), []byte(`{"ino":1,"name":"user.a"}`))
	f.Add(uint8(22), []byte(`{"ino":1}`))
	f.Add(uint8(23), []byte(`{"ino":1,"name":"system.posix_acl_access"}`))
	f.Add(uint8(19), []byte(`{"ino":2,"renew":true}`))
	f.Add(uint8(24), []byte(`{"ino":2,"session":1,"owner":1,"type":2,"start":0,"end":9223372036854775807}`))
	f.Add(uint8(24), []byte(`{"ino":2,"session":1,"owner":2,"type":1,"start":18446744073709551615,"end":18446744073709551615,"flock":true}`))
	f.Add(uint8(24), []byte(`{"ino":2,"session":1,"owner":3,"type":2,"start":5,"end":1,"test":true}`))
	f.Add(uint8(25), []byte(`{"session":1,"end":true}`))
	f.Add(uint8(26), []byte(`{"node":1,"after":0,"chunks":[{"chunk":1,"version":1,"length":5},{"chunk":99,"version":0,"length":0}],"done":true}`))
	f.Add(uint8(26), []byte(`{"node":1,"after":18446744073709551615,"chunks":[{"chunk":3,"length":-1}]}`))
	f.Add(uint8(27), []byte(`{"node":0,"refresh":true,"who":{"uid":0}}`))
	// Names that are not UTF-8, and JSON that cannot carry them exactly.
	f.Add(uint8(3), []byte(`{"parent":1,"name":{"base64":"Y2Fm6S50eHQ="},"type":"symlink","target":{"base64":"Li4v/w=="}}`))
	f.Add(uint8(3), []byte(`{"parent":1,"name":"caf\udce9.txt","type":"file","mode":420}`))
	f.Add(uint8(3), []byte("{\"parent\":1,\"name\":\"caf\xe9.txt\",\"type\":\"file\"}"))
	f.Add(uint8(7), []byte(`{"ino":1,"after":{"base64":"/w=="}}`))
	f.Add(uint8(19), []byte(`{"ino":1,"name":{"base64":"dXNlci7p"},"value":"eA=="}`))
	fx := newFixture(f)
	s := fx.s
	h := s.Handler()
	clientAuth := metaapi.ClientAuth(1, s.credKey.ClientCredential(1))
	// Node calls carry node 1's certificate, as the TLS layer verified it.
	tok, err := s.NewJoinToken(time.Hour, 0)
	if err != nil {
		f.Fatal(err)
	}
	_, csrDER, _ := pki.NewNodeKey()
	joined, err := s.Join(metaapi.JoinReq{Token: tok.Token, CSR: csrDER})
	if err != nil {
		f.Fatal(err)
	}
	cert, err := pki.ParseCert([]byte(joined.Cert))
	if err != nil {
		f.Fatal(err)
	}
	nodeTLS := &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{cert}}}
	f.Fuzz(func(t *testing.T, opIdx uint8, body []byte) {
		op := ops[int(opIdx)%len(ops)]
		req := httptest.NewRequest(http.MethodPost, "/v1/"+op, bytes.NewReader(body))
		if op == metaapi.OpRegister || op == metaapi.OpHeartbeat || op == metaapi.OpInventory {
			req.TLS = nodeTLS
		} else {
			req.Header.Set("Authorization", clientAuth)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("%s %q: HTTP %d %s", op, body, rec.Code, rec.Body.Bytes())
		}
		if !json.Valid(rec.Body.Bytes()) {
			t.Fatalf("%s: reply is not JSON: %q", op, rec.Body.Bytes())
		}
		if rec.Code != http.StatusOK {
			var me metaapi.Error
			if json.Unmarshal(rec.Body.Bytes(), &me) != nil || me.Code == "" {
				t.Fatalf("%s: error reply without a code: %q", op, rec.Body.Bytes())
			}
		}
		if err := s.Check(); err != nil {
			t.Fatalf("%s %q broke an invariant: %v", op, body, err)
		}
	})
}
