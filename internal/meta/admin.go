package meta

import "github.com/sluicefs/sluice/internal/metaapi"

// requireAdmin refuses a caller that may not administer the cluster
// (drain or remove nodes, set policies outside its path, manage
// principals, issue join tokens, run checks).
func (s *Service) requireAdmin(c caller) error {
	// An admin confined to a path is no admin: managing principals, it
	// could give itself any path (validRights refuses making one).
	if c.kind != callerClient || c.p == nil || !c.p.rec.Rights.Admin || c.p.scoped() {
		name := ""
		if c.p != nil {
			name = c.p.rec.Name
		}
		return metaapi.Errorf(metaapi.EPERM, "operation not permitted: principal %q is not an admin", name)
	}
	return nil
}
