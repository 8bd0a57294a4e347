package meta

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/config"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/pki"
)

func newHTTP(t *testing.T) (*fixture, *httptest.Server) {
	return newTLSFixture(t)
}

func client(t *testing.T, srv *httptest.Server, auth string) *metaapi.Client {
	c := metaapi.NewClient(addrOf(srv), auth, clientTLS(srv))
	c.RetryFor = 0
	t.Cleanup(c.Close)
	return c
}

func TestHTTPAuth(t *testing.T) {
	f, srv := newHTTP(t)
	sec := f.s.Secret()
	ctx := context.Background()
	good := client(t, srv, metaapi.ClientAuth(1, f.s.credKey.ClientCredential(1)))
	node, id := joinedClient(t, f, srv)
	for _, tc := range []struct {
		name string
		auth string
		op   string
		req  any
		want metaapi.Code
	}{
		{"no credential", "", metaapi.OpStatus, struct{}{}, metaapi.EAUTH},
		{"wrong credential", metaapi.ClientAuth(1, strings.Repeat("0", 64)), metaapi.OpStatus, struct{}{}, metaapi.EAUTH},
		{"credential of another id", metaapi.ClientAuth(2, f.s.credKey.ClientCredential(1)), metaapi.OpStatus, struct{}{}, metaapi.EAUTH},
		{"malformed bearer", "Bearer " + f.s.credKey.ClientCredential(1), metaapi.OpStatus, struct{}{}, metaapi.EAUTH},
		{"non-numeric id", metaapi.ClientAuth(1, f.s.credKey.ClientCredential(1))[:7] + "x:" + f.s.credKey.ClientCredential(1), metaapi.OpStatus, struct{}{}, metaapi.EAUTH},
		{"basic auth", "Basic dXNlcjpwYXNz", metaapi.OpStatus, struct{}{}, metaapi.EAUTH},
		{"node token (no longer a credential)", "Node " + sec.NodeToken(), metaapi.OpHeartbeat, metaapi.HeartbeatReq{ID: 1}, metaapi.EAUTH},
		{"client credential on Register", metaapi.ClientAuth(1, f.s.credKey.ClientCredential(1)), metaapi.OpRegister, metaapi.RegisterReq{Addr: "h:1"}, metaapi.EAUTH},
		{"client credential on Heartbeat", metaapi.ClientAuth(1, f.s.credKey.ClientCredential(1)), metaapi.OpHeartbeat, metaapi.HeartbeatReq{ID: 1}, metaapi.EAUTH},
		{"client id 2, no such principal", metaapi.ClientAuth(2, f.s.credKey.ClientCredential(2)), metaapi.OpStatus, struct{}{}, metaapi.EAUTH},
		{"admin", metaapi.ClientAuth(1, f.s.credKey.ClientCredential(1)), metaapi.OpStatus, struct{}{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := client(t, srv, tc.auth).Call(ctx, tc.op, tc.req, nil)
			if tc.want == "" && err != nil || tc.want != "" && !metaapi.IsCode(err, tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
	if err := node.Call(ctx, metaapi.OpStatus, struct{}{}, nil); err != nil {
		t.Fatalf("node Status: %v", err)
	}
	var reg metaapi.RegisterResp
	if err := node.Call(ctx, metaapi.OpRegister, metaapi.RegisterReq{ID: id, Addr: "127.0.0.1:9"}, &reg); err != nil || reg.ID != 1 {
		t.Fatalf("node register: %+v %v", reg, err)
	}
	var hb metaapi.HeartbeatResp
	if err := node.Call(ctx, metaapi.OpHeartbeat, metaapi.HeartbeatReq{ID: reg.ID}, &hb); err != nil || len(hb.Nodes) != 1 {
		t.Fatalf("node heartbeat: %+v %v", hb, err)
	}
	var st metaapi.StatusResp
	if err := good.Call(ctx, metaapi.OpStatus, struct{}{}, &st); err != nil || len(st.Nodes) != 1 || st.Dirs != 1 {
		t.Fatalf("status: %+v %v", st, err)
	}
}

func TestHTTPProtocol(t *testing.T) {
	f, srv := newHTTP(t)
	auth := metaapi.ClientAuth(1, f.s.credKey.ClientCredential(1))
	for _, tc := range []struct {
		name   string
		method string
		path   string
		auth   string
		body   string
		status int
		code   metaapi.Code
	}{
		{"unknown op", "POST", "/v1/Frobnicate", auth, "{}", 404, metaapi.EINVAL},
		{"no such path", "POST", "/v2/Status", auth, "{}", 404, metaapi.EINVAL},
		{"nested path", "POST", "/v1/Status/x", auth, "{}", 404, metaapi.EINVAL},
		{"GET", "GET", "/v1/Status", auth, "", 405, metaapi.EINVAL},
		{"bad json", "POST", "/v1/GetAttr", auth, "{", 400, metaapi.EINVAL},
		{"wrong json type", "POST", "/v1/GetAttr", auth, `{"ino":"x"}`, 400, metaapi.EINVAL},
		{"empty body", "POST", "/v1/Status", auth, "", 200, ""},
		{"too big", "POST", "/v1/Readdir", auth, `{"after":"` + strings.Repeat("a", metaapi.MaxBodyBytes) + `"}`, 400, metaapi.EINVAL},
		{"no auth", "POST", "/v1/Status", "", "{}", 401, metaapi.EAUTH},
		{"enoent status", "POST", "/v1/GetAttr", auth, `{"ino":99}`, 404, metaapi.ENOENT},
		{"eexist status", "POST", "/v1/Create", auth, `{"parent":1,"name":"x","type":"dir"}`, 200, ""},
		{"eexist status 2", "POST", "/v1/Create", auth, `{"parent":1,"name":"x","type":"dir"}`, 409, metaapi.EEXIST},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, srv.URL+tc.path, strings.NewReader(tc.body))
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			resp, err := httpsClient(srv).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d (%.200s)", resp.StatusCode, tc.status, raw)
			}
			if tc.code != "" {
				var e metaapi.Error
				if err := json.Unmarshal(raw, &e); err != nil || e.Code != tc.code || e.Message == "" {
					t.Fatalf("body %.200s, want code %s", raw, tc.code)
				}
			}
			if strings.Contains(string(raw), f.s.Secret().String()) || strings.Contains(string(raw), f.s.Secret().NodeToken()) {
				t.Fatal("reply leaks a secret")
			}
		})
	}
	resp, err := httpsClient(srv).Get(srv.URL + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz: %v %v", resp, err)
	}
	resp.Body.Close()
}

// TestHTTPEndToEnd drives every client op through metaapi.Client.
func TestHTTPEndToEnd(t *testing.T) {
	f, srv := newHTTP(t)
	f.addNodes(3)
	added, err := f.s.AddPrincipal(metaapi.AuthAddReq{Name: "carol"})
	if err != nil || added.Principal.ID != 2 {
		t.Fatalf("adding a principal: %+v %v", added, err)
	}
	c := client(t, srv, metaapi.ClientAuth(2, added.Credential))
	ctx := context.Background()
	call := func(op string, req, resp any) {
		t.Helper()
		if err := c.Call(ctx, op, req, resp); err != nil {
			t.Fatalf("%s: %v", op, err)
		}
	}
	var a metaapi.AttrResp
	call(metaapi.OpCreate, metaapi.CreateReq{Parent: ids.RootIno, Name: "d", Type: metaapi.TypeDir, Mode: 0o755}, &a)
	dir := a.Attr.Ino
	call(metaapi.OpCreate, metaapi.CreateReq{Parent: dir, Name: "f", Type: metaapi.TypeFile, Mode: 0o644}, &a)
	file := a.Attr.Ino
	call(metaapi.OpResolve, metaapi.ResolveReq{Path: "/d/f"}, &a)
	if a.Attr.Ino != file {
		t.Fatalf("resolve gave %d", a.Attr.Ino)
	}
	call(metaapi.OpLookup, metaapi.LookupReq{Parent: dir, Name: "f"}, &a)
	call(metaapi.OpGetAttr, metaapi.GetAttrReq{Ino: file}, &a)
	call(metaapi.OpLink, metaapi.LinkReq{Ino: file, NewParent: ids.RootIno, NewName: "h"}, &a)
	if a.Attr.Nlink != 2 {
		t.Fatalf("nlink %d", a.Attr.Nlink)
	}
	var lr metaapi.LayoutResp
	call(metaapi.OpLayout, metaapi.LayoutReq{Ino: file, Len: 10, Write: true}, &lr)
	if len(lr.Chunks) != 1 || len(lr.Chunks[0].Replicas) != 3 {
		t.Fatalf("layout %+v", lr)
	}
	var cp capability.Capability
	if _, err := f.s.keys.Open(lr.Chunks[0].Cap, f.clk.Now().UnixNano(), &cp); err != nil || cp.Client != 2 {
		t.Fatalf("capability over HTTP: client %v, %v", cp.Client, err)
	}
	call(metaapi.OpCommit, metaapi.CommitReq{Ino: file, Size: 10, Chunks: []metaapi.ChunkVersion{{Index: 0, Chunk: lr.Chunks[0].Chunk, Version: 1}}}, &a)
	if a.Attr.Size != 10 {
		t.Fatalf("size %d", a.Attr.Size)
	}
	call(metaapi.OpSetAttr, metaapi.SetAttrReq{Ino: file, Mode: ptr(uint32(0o600))}, &a)
	var pr metaapi.PolicyResp
	call(metaapi.OpSetPolicy, metaapi.SetPolicyReq{Ino: dir, Policy: ring(2)}, &pr)
	call(metaapi.OpGetPolicy, metaapi.GetPolicyReq{Ino: dir}, &pr)
	if pr.Policy != ring(2) || pr.From != dir {
		t.Fatalf("policy %+v", pr)
	}
	call(metaapi.OpRename, metaapi.RenameReq{OldParent: dir, OldName: "f", NewParent: dir, NewName: "g"}, nil)
	var rd metaapi.ReaddirResp
	call(metaapi.OpReaddir, metaapi.ReaddirReq{Ino: dir}, &rd)
	if len(rd.Entries) != 1 || rd.Entries[0].Name != "g" {
		t.Fatalf("readdir %+v", rd)
	}
	call(metaapi.OpRemove, metaapi.RemoveReq{Parent: dir, Name: "g"}, nil)
	err = c.Call(ctx, metaapi.OpRemove, metaapi.RemoveReq{Parent: ids.RootIno, Name: "d", Dir: true}, nil)
	wantCode(t, err, "")
	err = c.Call(ctx, metaapi.OpRemove, metaapi.RemoveReq{Parent: ids.RootIno, Name: "d", Dir: true}, nil)
	wantCode(t, err, metaapi.ENOENT)
}

func TestServeAndClientConf(t *testing.T) {
	f := newFixture(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- f.s.Serve(ln) }()
	addr := ln.Addr().String()
	path, err := f.s.WriteClientConf(addr)
	if err != nil {
		t.Fatal(err)
	}
	conf, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if conf.Meta != addr || conf.ClientID != 1 {
		t.Fatalf("conf %+v", conf)
	}
	tc, err := pki.ClientConfig([]byte(conf.CA))
	if err != nil {
		t.Fatal(err)
	}
	c := metaapi.NewClient(conf.Meta, metaapi.ClientAuth(conf.ClientID, conf.Credential), tc)
	defer c.Close()
	var st metaapi.StatusResp
	if err := c.Call(context.Background(), metaapi.OpStatus, struct{}{}, &st); err != nil {
		t.Fatal(err)
	}
	if st.MetaAddr != addr {
		t.Fatalf("status meta addr %q, want %q", st.MetaAddr, addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := f.s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Serve returned %v after Shutdown", err)
	}
	for in, want := range map[string]string{
		":7000": "127.0.0.1:7000", "0.0.0.0:7000": "127.0.0.1:7000", "[::]:7000": "127.0.0.1:7000",
		"10.1.2.3:7000": "10.1.2.3:7000", "[::1]:7000": "[::1]:7000",
	} {
		if got := AdvertiseAddr(in); got != want {
			t.Errorf("AdvertiseAddr(%q) = %q, want %q", in, got, want)
		}
	}
}
