package meta

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/cockroachdb/pebble/v2"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// Principals (docs/security.md): each client.conf holds one principal's
// id and credential. Meta keeps only a hash of the credential, so its
// database does not grant access; the credential is shown once, when the
// principal is added or rotated.

const pPrincipal = 'p'

// AdminID is the operator's principal, made on first start. Its first
// credential derives from meta's credential key (CredKeyFile), so meta can
// rewrite its own client.conf until the operator rotates it.
const AdminID ids.ClientID = 1

// AdminName is the operator principal's name.
const AdminName = "admin"

// SystemID is the principal of meta's own clients (SystemConf): an admin
// that is never stored, listed or removed, whose credential derives from
// meta's credential key, which never leaves meta.
const SystemID ids.ClientID = 1 << 62

const systemName = "meta-internal"

type principalRec struct {
	metaapi.Principal
	Hash string `json:"hash"` // hex SHA-256 of the credential
}

func principalKey(id ids.ClientID) []byte {
	return binary.BigEndian.AppendUint64([]byte{pPrincipal}, uint64(id))
}

// principal is a loaded principal; immutable once published.
type principal struct {
	rec   principalRec
	hash  [sha256.Size]byte
	gids  metaapi.IDRanges // the gids it may act with (see Rights.GIDs)
	scope *scopeCache      // directories judged beneath its root
}

func newPrincipal(rec principalRec) (*principal, error) {
	p := &principal{rec: rec, gids: rec.Rights.GIDs, scope: &scopeCache{}}
	raw, err := hex.DecodeString(rec.Hash)
	if err != nil || len(raw) != sha256.Size {
		return nil, fmt.Errorf("principal %d: credential hash is not %d hex bytes", rec.ID, sha256.Size)
	}
	copy(p.hash[:], raw)
	if len(p.gids) == 0 {
		// A principal confined to some uids is confined to the same gids
		// unless told otherwise (user private groups): it must not claim
		// a privileged group any more than a privileged uid.
		p.gids = rec.Rights.UIDs
	}
	return p, nil
}

func hashCredential(cred string) string {
	sum := sha256.Sum256([]byte(cred))
	return hex.EncodeToString(sum[:])
}

func (p *principal) matches(cred string) bool {
	sum := sha256.Sum256([]byte(cred))
	return subtle.ConstantTimeCompare(sum[:], p.hash[:]) == 1
}

// scoped reports whether the principal is confined below the root.
func (p *principal) scoped() bool { return p.rec.Root != 0 && p.rec.Root != ids.RootIno }

// root is the directory the principal sees as "/".
func (p *principal) root() ids.Ino {
	if p.rec.Root == 0 {
		return ids.RootIno
	}
	return p.rec.Root
}

// mapWho returns the identity a request claiming w acts as: squashed as
// the principal's rights say, and refused if it claims a uid or group
// the principal may not act as.
func (p *principal) mapWho(w metaapi.Who) (metaapi.Who, error) {
	if len(w.GIDs) > maxGroups {
		return w, metaapi.Errorf(metaapi.EINVAL, "%d supplementary groups, at most %d allowed", len(w.GIDs), maxGroups)
	}
	r := p.rec.Rights
	anon := metaapi.Who{UID: metaapi.AnonUID, GID: metaapi.AnonGID}
	switch r.Squash {
	case metaapi.SquashAll:
		return anon, nil
	case metaapi.SquashRoot:
		if w.UID == 0 {
			return anon, nil
		}
		if w.GID == 0 {
			w.GID = metaapi.AnonGID
		}
		w.GIDs = dropGroup(w.GIDs, 0)
	}
	if !r.UIDs.Contains(w.UID) {
		return w, metaapi.Errorf(metaapi.EPERM, "principal %q may act as uids %s, not %d", p.rec.Name, r.UIDs, w.UID)
	}
	if !p.gids.Contains(w.GID) {
		return w, metaapi.Errorf(metaapi.EPERM, "principal %q may act with gids %s, not %d", p.rec.Name, p.gids, w.GID)
	}
	if len(p.gids) > 0 {
		// Supplementary groups it may not claim are dropped, as groups
		// a process is not in: they only ever grant access.
		kept := w.GIDs[:0:0]
		for _, g := range w.GIDs {
			if p.gids.Contains(g) {
				kept = append(kept, g)
			}
		}
		w.GIDs = kept
	}
	return w, nil
}

// maxGroups is Linux's NGROUPS_MAX.
const maxGroups = 65536

func dropGroup(gids []uint32, g uint32) []uint32 {
	out := gids[:0:0]
	for _, x := range gids {
		if x != g {
			out = append(out, x)
		}
	}
	return out
}

// principalSet is the published set of principals (copied on change).
type principalSet struct {
	byID   map[ids.ClientID]*principal
	byName map[string]*principal
}

func (s *Service) principalSet() *principalSet { return s.princ.Load() }

// loadPrincipals reads every principal, creating the operator's if there
// is none (a new database, or one from before principals).
func (s *Service) loadPrincipals() error {
	set := &principalSet{byID: map[ids.ClientID]*principal{}, byName: map[string]*principal{}}
	err := scan(s.db, []byte{pPrincipal}, []byte{pPrincipal + 1}, func(_, v []byte) (bool, error) {
		var rec principalRec
		if err := json.Unmarshal(v, &rec); err != nil {
			return false, fmt.Errorf("decoding a principal: %w", err)
		}
		p, err := newPrincipal(rec)
		if err != nil {
			return false, err
		}
		set.byID[rec.ID] = p
		set.byName[rec.Name] = p
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("loading principals: %w", err)
	}
	if p, ok := set.byID[AdminID]; ok && p.matches(s.sec.ClientCredential(uint64(AdminID))) {
		// A credential derived from the cluster secret, which storage
		// nodes held (before principals and TLS): whoever has a node's
		// disk could present it. Meta's own key replaces it, and meta
		// writes the new one to its client.conf at start.
		rec := p.rec
		rec.Hash, rec.Rotated = hashCredential(s.credKey.ClientCredential(uint64(AdminID))), s.opts.Now().UnixNano()
		if err := s.db.Set(principalKey(AdminID), mustJSON(&rec), pebble.Sync); err != nil {
			return fmt.Errorf("replacing the operator's credential: %w", err)
		}
		np, err := newPrincipal(rec)
		if err != nil {
			return err
		}
		set.byID[AdminID], set.byName[rec.Name] = np, np
		s.log.Warn("the operator's credential derived from the cluster secret, which nodes held: replaced; copies of the old client.conf stop working")
	}
	if len(set.byID) == 0 {
		rec := principalRec{
			Principal: metaapi.Principal{ID: AdminID, Name: AdminName, Rights: metaapi.Rights{Path: "/", Admin: true},
				Root: ids.RootIno, Created: s.opts.Now().UnixNano()},
			Hash: hashCredential(s.credKey.ClientCredential(uint64(AdminID))),
		}
		if err := s.db.Set(principalKey(AdminID), mustJSON(&rec), pebble.Sync); err != nil {
			return fmt.Errorf("creating the operator's principal: %w", err)
		}
		p, err := newPrincipal(rec)
		if err != nil {
			return err
		}
		set.byID[AdminID], set.byName[AdminName] = p, p
		s.log.Info("created the operator's admin principal", "name", AdminName)
	}
	sys, err := newPrincipal(principalRec{
		Principal: metaapi.Principal{ID: SystemID, Name: systemName, Rights: metaapi.Rights{Path: "/", Admin: true}, Root: ids.RootIno},
		Hash:      hashCredential(s.credKey.ClientCredential(uint64(SystemID))),
	})
	if err != nil {
		return err
	}
	set.byID[SystemID] = sys // not by name: it cannot be rotated or removed
	s.princ.Store(set)
	return nil
}

// publishPrincipal replaces (or with p nil, removes) principal id in the
// published set; called after the change is committed, under s.mu.
func (s *Service) publishPrincipal(id ids.ClientID, p *principal) {
	old := s.princ.Load()
	set := &principalSet{byID: make(map[ids.ClientID]*principal, len(old.byID)+1), byName: make(map[string]*principal, len(old.byName)+1)}
	for k, v := range old.byID {
		if k != id {
			set.byID[k] = v
		}
	}
	for k, v := range old.byName {
		if v.rec.ID != id {
			set.byName[k] = v
		}
	}
	if p != nil {
		set.byID[id], set.byName[p.rec.Name] = p, p
	}
	s.princ.Store(set)
}

// validPrincipalName: letters, digits and . _ - @, so names are safe in
// files, logs and command lines.
func validPrincipalName(name string) error {
	if name == "" || len(name) > metaapi.MaxPrincipalName {
		return metaapi.Errorf(metaapi.EINVAL, "a principal's name has 1 to %d characters", metaapi.MaxPrincipalName)
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("._-@", c)) {
			return metaapi.Errorf(metaapi.EINVAL, "principal name %q: only letters, digits and . _ - @ are allowed", name)
		}
	}
	return nil
}

func validRights(r metaapi.Rights) error {
	switch r.Squash {
	case metaapi.SquashNone, metaapi.SquashRoot, metaapi.SquashAll:
	default:
		return metaapi.Errorf(metaapi.EINVAL, "squash %q: want root, all or none", r.Squash)
	}
	if err := r.UIDs.Validate(); err != nil {
		return metaapi.Errorf(metaapi.EINVAL, "uids: %v", err)
	}
	if err := r.GIDs.Validate(); err != nil {
		return metaapi.Errorf(metaapi.EINVAL, "gids: %v", err)
	}
	if r.Path != "" && !strings.HasPrefix(r.Path, "/") {
		return metaapi.Errorf(metaapi.EINVAL, "path %q is not absolute", r.Path)
	}
	if r.Admin && strings.Trim(r.Path, "/") != "" {
		// An admin manages principals, so it could give itself any path.
		return metaapi.Errorf(metaapi.EINVAL, "an admin principal cannot be confined to a path (%s)", r.Path)
	}
	return nil
}

func newCredential() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("making a credential: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// AddPrincipal creates a principal and returns its credential.
func (s *Service) AddPrincipal(req metaapi.AuthAddReq) (metaapi.AuthCredResp, error) {
	return s.addPrincipal(req, nil)
}

// addPrincipal is AddPrincipal for a caller whose credential valid
// checks, under meta's lock.
func (s *Service) addPrincipal(req metaapi.AuthAddReq, valid func() error) (metaapi.AuthCredResp, error) {
	var out metaapi.AuthCredResp
	if err := validPrincipalName(req.Name); err != nil {
		return out, err
	}
	if req.Rights.Path == "" {
		req.Rights.Path = "/"
	}
	if err := validRights(req.Rights); err != nil {
		return out, err
	}
	cred, err := newCredential()
	if err != nil {
		return out, err
	}
	err = s.update(func(tx *txn) error {
		if err := check(valid); err != nil {
			return err
		}
		if _, taken := s.principalSet().byName[req.Name]; taken {
			return metaapi.Errorf(metaapi.EEXIST, "a principal named %q exists", req.Name)
		}
		dir, err := resolveNoLinks(tx, req.Rights.Path)
		if err != nil {
			return err
		}
		if tx.ctr.NextPrincipal <= AdminID {
			tx.ctr.NextPrincipal = AdminID + 1
		}
		rec := principalRec{
			Principal: metaapi.Principal{ID: tx.ctr.NextPrincipal, Name: req.Name, Rights: req.Rights, Root: dir.Ino, Created: tx.now},
			Hash:      hashCredential(cred),
		}
		tx.ctr.NextPrincipal++
		p, err := newPrincipal(rec)
		if err != nil {
			return err
		}
		tx.after = append(tx.after, func() { s.publishPrincipal(rec.ID, p) })
		out = metaapi.AuthCredResp{Principal: rec.Principal, Credential: cred}
		return tx.setJSON(principalKey(rec.ID), &rec)
	})
	return out, err
}

// RotatePrincipal gives a principal a new credential; the old one stops
// working at once, and so do capabilities minted under it.
func (s *Service) RotatePrincipal(name string) (metaapi.AuthCredResp, error) {
	return s.rotatePrincipal(name, nil)
}

func (s *Service) rotatePrincipal(name string, valid func() error) (metaapi.AuthCredResp, error) {
	var out metaapi.AuthCredResp
	cred, err := newCredential()
	if err != nil {
		return out, err
	}
	var id ids.ClientID
	err = s.update(func(tx *txn) error {
		if err := check(valid); err != nil {
			return err
		}
		old, ok := s.principalSet().byName[name]
		if !ok {
			return metaapi.Errorf(metaapi.ENOENT, "no principal named %q", name)
		}
		rec := old.rec
		rec.Hash, rec.Rotated = hashCredential(cred), tx.now
		p, err := newPrincipal(rec)
		if err != nil {
			return err
		}
		id = rec.ID
		tx.after = append(tx.after, func() { s.publishPrincipal(rec.ID, p) })
		out = metaapi.AuthCredResp{Principal: rec.Principal, Credential: cred}
		return tx.setJSON(principalKey(rec.ID), &rec)
	})
	if err == nil {
		err = s.revokeCapabilities(id)
	}
	return out, err
}

// RemovePrincipal deletes a principal: its credential stops working at
// once, and so do capabilities minted under it. The last admin cannot be
// removed (nobody could manage the cluster).
func (s *Service) RemovePrincipal(name string) error {
	return s.removePrincipal(name, nil)
}

func (s *Service) removePrincipal(name string, valid func() error) error {
	var id ids.ClientID
	err := s.update(func(tx *txn) error {
		if err := check(valid); err != nil {
			return err
		}
		set := s.principalSet()
		p, ok := set.byName[name]
		if !ok {
			return metaapi.Errorf(metaapi.ENOENT, "no principal named %q", name)
		}
		if p.rec.Rights.Admin {
			admins := 0
			for _, q := range set.byName {
				if q.rec.Rights.Admin {
					admins++
				}
			}
			if admins == 1 {
				return eperm("%q is the last admin principal", name)
			}
		}
		id = p.rec.ID
		tx.after = append(tx.after, func() { s.publishPrincipal(id, nil) })
		return tx.b.Delete(principalKey(id), nil)
	})
	if err == nil {
		err = s.revokeCapabilities(id)
	}
	return err
}

// ListPrincipals returns every principal by name.
func (s *Service) ListPrincipals() (metaapi.AuthListResp, error) {
	set := s.principalSet()
	out := metaapi.AuthListResp{Principals: make([]metaapi.Principal, 0, len(set.byID))}
	for _, p := range set.byName {
		out.Principals = append(out.Principals, p.rec.Principal)
	}
	sort.Slice(out.Principals, func(i, j int) bool { return out.Principals[i].Name < out.Principals[j].Name })
	return out, nil
}

// AdminCredentialDerived reports whether the operator's principal still
// has the credential meta derives (so meta may write its client.conf).
func (s *Service) AdminCredentialDerived() bool {
	p, ok := s.principalSet().byID[AdminID]
	return ok && p.matches(s.credKey.ClientCredential(uint64(AdminID)))
}

// revokeCapabilities makes nodes refuse the capabilities minted for
// client before now (capkeys.go).
func (s *Service) revokeCapabilities(client ids.ClientID) error { return s.RevokeCapabilities(client) }

// resolveNoLinks resolves a principal's path with no symbolic link in
// it (whoever may change a link along it would choose the principal's
// root), no "." or "..", to a directory.
func resolveNoLinks(v ns, path string) (*inode, error) {
	cur, err := v.inode(ids.RootIno)
	if err != nil {
		return nil, err
	}
	for _, comp := range strings.Split(path, "/") {
		if comp == "" {
			continue
		}
		if comp == "." || comp == ".." {
			return nil, metaapi.Errorf(metaapi.EINVAL, "path %q: give it without . or ..", path)
		}
		_, next, err := child(v, cur.Ino, comp)
		if err != nil {
			return nil, err
		}
		if next.Type == metaapi.TypeSymlink {
			return nil, metaapi.Errorf(metaapi.EINVAL, "path %q: %q is a symbolic link; give the directory's own path", path, comp)
		}
		if !next.isDir() {
			return nil, metaapi.Errorf(metaapi.ENOTDIR, "path %q: %q is not a directory", path, comp)
		}
		cur = next
	}
	return cur, nil
}

// check runs valid if there is one.
func check(valid func() error) error {
	if valid == nil {
		return nil
	}
	return valid()
}
