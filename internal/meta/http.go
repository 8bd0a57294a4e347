package meta

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// The HTTP layer: POST /v1/<Op> with a JSON body, as metaapi describes,
// plus GET /healthz. It authenticates, decodes, calls the Service method
// and encodes; no decision is made here.

// callerKind says who presented which credential.
type callerKind int

const (
	callerNone callerKind = iota
	callerClient
	callerNode
)

type caller struct {
	kind   callerKind
	client ids.ClientID
	p      *principal // a client's principal
	node   ids.NodeID // callerNode: the node its certificate names (tls.go)
	remote string     // the address the call came from (nodeaddr.go)
}

// authenticate checks an Authorization header value in constant time.
func (s *Service) authenticate(h string) caller {
	if rest, ok := strings.CutPrefix(h, "Bearer "); ok {
		idText, cred, ok := strings.Cut(rest, ":")
		if !ok {
			return caller{}
		}
		id, err := strconv.ParseUint(idText, 10, 64)
		if err != nil {
			return caller{}
		}
		if p, ok := s.principalSet().byID[ids.ClientID(id)]; ok && p.matches(cred) {
			return caller{kind: callerClient, client: p.rec.ID, p: p}
		}
		return caller{}
	}
	return caller{}
}

// An op is one /v1/<Op> endpoint.
type op struct {
	clients, nodes bool  // which callers may use it
	anyone         bool  // callers without a credential too (Join: the token is one)
	maxBody        int64 // bound on the request body; 0: metaapi.MaxBodyBytes
	serve          func(s *Service, c caller, body io.Reader) (any, error)
	// stream, instead of serve, for an op whose reply is a byte stream
	// (Backup): it prepares, failing as any op does, and returns what
	// writes the reply.
	stream func(s *Service, c caller) (func(io.Writer) error, error)
}

// endpoint builds an op from a typed method.
func endpoint[Req any, Resp any](clients, nodes bool, f func(s *Service, c caller, req Req) (Resp, error)) op {
	shape := shapeOf(reflect.TypeFor[Req]())
	return op{clients: clients, nodes: nodes, serve: func(s *Service, c caller, body io.Reader) (any, error) {
		var req Req
		if err := json.NewDecoder(body).Decode(&req); err != nil && !errors.Is(err, io.EOF) {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				return nil, metaapi.Errorf(metaapi.EINVAL, "request body larger than %d bytes", tooBig.Limit)
			}
			return nil, metaapi.Errorf(metaapi.EINVAL, "decoding request: %v", err)
		}
		if err := s.admitReq(c, shape, &req); err != nil {
			return nil, err
		}
		return f(s, c, req)
	}}
}

type empty struct{}

func attrResp(a metaapi.Attr, err error) (metaapi.AttrResp, error) {
	return metaapi.AttrResp{Attr: a}, err
}

var ops = map[string]op{
	metaapi.OpResolve: endpoint(true, false, func(s *Service, _ caller, r metaapi.ResolveReq) (metaapi.AttrResp, error) {
		return attrResp(s.Resolve(r))
	}),
	metaapi.OpLookup: endpoint(true, false, func(s *Service, _ caller, r metaapi.LookupReq) (metaapi.AttrResp, error) {
		return attrResp(s.Lookup(r))
	}),
	metaapi.OpGetAttr: endpoint(true, false, func(s *Service, _ caller, r metaapi.GetAttrReq) (metaapi.AttrResp, error) {
		return attrResp(s.GetAttr(r))
	}),
	metaapi.OpCreate: endpoint(true, false, func(s *Service, c caller, r metaapi.CreateReq) (metaapi.AttrResp, error) {
		return s.create(c.client, r)
	}),
	metaapi.OpLink: endpoint(true, false, func(s *Service, _ caller, r metaapi.LinkReq) (metaapi.AttrResp, error) {
		return s.link(r)
	}),
	metaapi.OpRemove: endpoint(true, false, func(s *Service, _ caller, r metaapi.RemoveReq) (metaapi.DirsResp, error) {
		return s.remove(r)
	}),
	metaapi.OpRename: endpoint(true, false, func(s *Service, _ caller, r metaapi.RenameReq) (metaapi.DirsResp, error) {
		return s.rename(r)
	}),
	metaapi.OpRelease: endpoint(true, false, func(s *Service, _ caller, r metaapi.ReleaseReq) (empty, error) {
		return empty{}, s.Release(r)
	}),
	metaapi.OpDrain: endpoint(true, false, func(s *Service, _ caller, r metaapi.DrainReq) (empty, error) {
		return empty{}, s.Drain(r)
	}),
	metaapi.OpRevokeNode: endpoint(true, false, func(s *Service, _ caller, r metaapi.RevokeNodeReq) (empty, error) {
		return empty{}, s.RevokeNode(r)
	}),
	metaapi.OpRemoveNode: endpoint(true, false, func(s *Service, _ caller, r metaapi.RemoveNodeReq) (empty, error) {
		return empty{}, s.RemoveNode(r)
	}),
	metaapi.OpReconcile: endpoint(true, false, func(s *Service, _ caller, r metaapi.ReconcileReq) (metaapi.ReconcileResp, error) {
		return s.Reconcile(r)
	}),
	metaapi.OpLock: endpoint(true, false, func(s *Service, c caller, r metaapi.LockReq) (metaapi.LockResp, error) {
		return s.Lock(c.client, r)
	}),
	metaapi.OpLockSess: endpoint(true, false, func(s *Service, c caller, r metaapi.LockSessionReq) (metaapi.LockSessionResp, error) {
		return s.LockSession(c.client, r)
	}),
	metaapi.OpSetXattr: endpoint(true, false, func(s *Service, _ caller, r metaapi.SetXattrReq) (empty, error) {
		return empty{}, s.SetXattr(r)
	}),
	metaapi.OpGetXattr: endpoint(true, false, func(s *Service, _ caller, r metaapi.XattrReq) (metaapi.XattrResp, error) {
		return s.GetXattr(r)
	}),
	metaapi.OpListXattr: endpoint(true, false, func(s *Service, _ caller, r metaapi.ListXattrReq) (metaapi.ListXattrResp, error) {
		return s.ListXattr(r)
	}),
	metaapi.OpRmXattr: endpoint(true, false, func(s *Service, _ caller, r metaapi.XattrReq) (empty, error) {
		return empty{}, s.RemoveXattr(r)
	}),
	metaapi.OpReaddir: endpoint(true, false, func(s *Service, _ caller, r metaapi.ReaddirReq) (metaapi.ReaddirResp, error) {
		return s.Readdir(r)
	}),
	metaapi.OpSetAttr: endpoint(true, false, func(s *Service, _ caller, r metaapi.SetAttrReq) (metaapi.AttrResp, error) {
		return attrResp(s.SetAttr(r))
	}),
	metaapi.OpSetPolicy: endpoint(true, false, func(s *Service, _ caller, r metaapi.SetPolicyReq) (metaapi.PolicyResp, error) {
		return s.SetPolicy(r)
	}),
	metaapi.OpGetPolicy: endpoint(true, false, func(s *Service, c caller, r metaapi.GetPolicyReq) (metaapi.PolicyResp, error) {
		resp, err := s.GetPolicy(r)
		if err == nil {
			resp.From, err = s.clampToRoot(c, resp.From)
		}
		return resp, err
	}),
	metaapi.OpLayout: endpoint(true, false, func(s *Service, c caller, r metaapi.LayoutReq) (metaapi.LayoutResp, error) {
		return s.layout(c.client, r, func() error { return s.current(c) })
	}),
	metaapi.OpCommit: endpoint(true, false, func(s *Service, _ caller, r metaapi.CommitReq) (metaapi.AttrResp, error) {
		return attrResp(s.Commit(r))
	}),
	metaapi.OpDegraded: endpoint(true, false, func(s *Service, _ caller, r metaapi.MarkDegradedReq) (empty, error) {
		return empty{}, s.MarkDegraded(r)
	}),
	metaapi.OpListDeg: endpoint(true, false, func(s *Service, _ caller, _ empty) (metaapi.ListDegradedResp, error) {
		return s.ListDegraded()
	}),
	metaapi.OpStatus: endpoint(true, true, func(s *Service, _ caller, _ empty) (metaapi.StatusResp, error) {
		return s.Status()
	}),
	metaapi.OpRegister: endpoint(false, true, func(s *Service, c caller, r metaapi.RegisterReq) (metaapi.RegisterResp, error) {
		if err := actsAs(c, r.ID); err != nil {
			return metaapi.RegisterResp{}, err
		}
		return s.registerFrom(r, c.remote)
	}),
	metaapi.OpReportBad: endpoint(true, false, func(s *Service, c caller, r metaapi.ReportCorruptReq) (empty, error) {
		return empty{}, s.ReportCorrupt(c.client, r)
	}),
	metaapi.OpHeartbeat: endpoint(false, true, func(s *Service, c caller, r metaapi.HeartbeatReq) (metaapi.HeartbeatResp, error) {
		if err := actsAs(c, r.ID); err != nil {
			return metaapi.HeartbeatResp{}, err
		}
		return s.heartbeatFrom(r, c.remote)
	}),
	metaapi.OpInventory: endpoint(false, true, func(s *Service, c caller, r metaapi.InventoryReq) (metaapi.InventoryResp, error) {
		if err := actsAs(c, r.Node); err != nil {
			return metaapi.InventoryResp{}, err
		}
		return s.Inventory(r)
	}),
	metaapi.OpJoinToken: endpoint(true, false, func(s *Service, c caller, r metaapi.JoinTokenReq) (metaapi.JoinTokenResp, error) {
		if err := s.requireAdmin(c); err != nil {
			return metaapi.JoinTokenResp{}, err
		}
		return s.NewJoinToken(time.Duration(r.TTL), r.Node)
	}),
	metaapi.OpJoin: {anyone: true, clients: true, nodes: true, maxBody: maxJoinBody, serve: endpoint(false, false, func(s *Service, _ caller, r metaapi.JoinReq) (metaapi.JoinResp, error) {
		return s.Join(r)
	}).serve},
	metaapi.OpCheck: endpoint(true, false, func(s *Service, _ caller, r metaapi.CheckReq) (metaapi.CheckResp, error) {
		return s.CheckState(r)
	}),
	metaapi.OpStrays: endpoint(true, false, func(s *Service, _ caller, r metaapi.StraysReq) (metaapi.StraysResp, error) {
		return s.Strays(r)
	}),
	metaapi.OpAuthAdd: endpoint(true, false, func(s *Service, c caller, r metaapi.AuthAddReq) (metaapi.AuthCredResp, error) {
		return s.addPrincipal(r, func() error { return s.current(c) })
	}),
	metaapi.OpAuthList: endpoint(true, false, func(s *Service, _ caller, _ empty) (metaapi.AuthListResp, error) {
		return s.ListPrincipals()
	}),
	metaapi.OpAuthRotate: endpoint(true, false, func(s *Service, c caller, r metaapi.AuthNameReq) (metaapi.AuthCredResp, error) {
		return s.rotatePrincipal(r.Name, func() error { return s.current(c) })
	}),
	metaapi.OpAuthRemove: endpoint(true, false, func(s *Service, c caller, r metaapi.AuthNameReq) (empty, error) {
		return empty{}, s.removePrincipal(r.Name, func() error { return s.current(c) })
	}),
	metaapi.OpBackup: backupOp,
	metaapi.OpWhoami: endpoint(true, false, func(s *Service, c caller, _ empty) (metaapi.Principal, error) {
		return c.p.rec.Principal, nil
	}),
}

// Handler returns the HTTP handler serving the API.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("/v1/{op}", s.serveOp)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, "", metaapi.Errorf(metaapi.EINVAL, "no such endpoint %s", r.URL.Path), http.StatusNotFound)
	})
	return mux
}

func (s *Service) serveOp(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	name := r.PathValue("op")
	c, err := s.authenticateNode(r.TLS)
	if err != nil {
		s.writeError(w, r, name, err, 0)
		return
	}
	if c.kind == callerNone {
		c = s.authenticate(r.Header.Get("Authorization"))
	}
	c.remote = r.RemoteAddr
	if c.kind == callerNone && !ops[name].anyone {
		s.writeError(w, r, name, metaapi.Errorf(metaapi.EAUTH, "missing or invalid credential"), http.StatusUnauthorized)
		return
	}
	o, ok := ops[name]
	if !ok {
		s.writeError(w, r, name, metaapi.Errorf(metaapi.EINVAL, "unknown operation %q", name), http.StatusNotFound)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		s.writeError(w, r, name, metaapi.Errorf(metaapi.EINVAL, "%s needs POST, not %s", name, r.Method), http.StatusMethodNotAllowed)
		return
	}
	if (c.kind == callerClient && !o.clients) || (c.kind == callerNode && !o.nodes) {
		who := "client"
		if c.kind == callerNode {
			who = "storage node"
		}
		s.writeError(w, r, name, metaapi.Errorf(metaapi.EAUTH, "a %s credential may not call %s", who, name), http.StatusForbidden)
		return
	}
	if err := s.admitOp(c, name); err != nil {
		s.writeError(w, r, name, err, 0)
		return
	}
	if o.stream != nil {
		s.serveStream(w, r, name, c, o)
		return
	}
	limit := o.maxBody
	if limit == 0 {
		limit = metaapi.MaxBodyBytes
	}
	resp, err := o.serve(s, c, http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		s.writeError(w, r, name, err, 0)
		return
	}
	body, err := json.Marshal(resp)
	if err != nil {
		s.writeError(w, r, name, err, 0)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(body)
	if s.log.Enabled(r.Context(), slog.LevelDebug) {
		s.log.Debug("meta call", "op", name, "dur", time.Since(start))
	}
}

// serveStream serves an op whose reply is a byte stream. The write
// deadline moves on with every write, so a long stream is not cut by
// the server's WriteTimeout while a stalled reader still is. A failure
// once the stream has begun aborts the connection: the reader sees a
// truncated stream (which a backup's checksum detects).
func (s *Service) serveStream(w http.ResponseWriter, r *http.Request, name string, c caller, o op) {
	write, err := o.stream(s, c)
	if err != nil {
		s.writeError(w, r, name, err, 0)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	if err := write(deadlineWriter{w, http.NewResponseController(w)}); err != nil {
		s.log.Warn("meta call failed while streaming its reply", "op", name, "remote", r.RemoteAddr, "err", err)
		panic(http.ErrAbortHandler)
	}
	s.log.Info("meta call streamed", "op", name, "remote", r.RemoteAddr)
}

// streamStall is how long a stream's reader may take to accept a write.
const streamStall = time.Minute

type deadlineWriter struct {
	w  io.Writer
	rc *http.ResponseController
}

func (d deadlineWriter) Write(p []byte) (int, error) {
	d.rc.SetWriteDeadline(time.Now().Add(streamStall))
	return d.w.Write(p)
}

// writeError replies with err as a metaapi.Error. Errors that are not
// *metaapi.Error are internal: they are logged and reported as EIO.
// status 0 means derive it from the code.
func (s *Service) writeError(w http.ResponseWriter, r *http.Request, op string, err error, status int) {
	var me *metaapi.Error
	if !errors.As(err, &me) {
		s.log.Error("internal error", "op", op, "err", err)
		me = metaapi.Errorf(metaapi.EIO, "internal error in %s: %v", op, err)
	} else if me.Code == metaapi.EAUTH {
		// Anyone may be refused, as often as they like: at most one
		// refusal a second is logged, with the count of the others.
		if ok, skipped := s.refusals.Allow(time.Now()); ok {
			s.log.Warn("meta call refused", "op", op, "remote", r.RemoteAddr, "err", me.Message, "also_refused_since_last_report", skipped)
		}
	} else if me.Code == metaapi.EIO {
		s.log.Warn("meta call failed", "op", op, "code", me.Code, "remote", r.RemoteAddr, "err", me.Message)
	} else {
		s.log.Debug("meta call failed", "op", op, "code", me.Code, "err", me.Message)
	}
	if status == 0 {
		status = httpStatus(me.Code)
	}
	body, _ := json.Marshal(me)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(body)
}

// httpStatus maps an error code to an HTTP status. Clients go by the code
// in the body; the status is for humans and proxies.
func httpStatus(c metaapi.Code) int {
	switch c {
	case metaapi.ENOENT:
		return http.StatusNotFound
	case metaapi.EEXIST, metaapi.ENOTEMPTY:
		return http.StatusConflict
	case metaapi.EACCES, metaapi.EPERM:
		return http.StatusForbidden
	case metaapi.EAUTH:
		return http.StatusUnauthorized
	case metaapi.ENOSPC:
		return http.StatusInsufficientStorage
	case metaapi.EAGAIN:
		return http.StatusServiceUnavailable
	case metaapi.EIO:
		return http.StatusInternalServerError
	}
	return http.StatusBadRequest
}
