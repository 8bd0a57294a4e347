package meta

import (
	"errors"

	"github.com/sluicefs/sluice/internal/metaapi"
)

// nsCheck is what the namespace check found. (Placeholder until the
// namespace check lands: Check's invariants as one kind.)
type nsCheck struct {
	Files, Dirs int64
	Problems    []metaapi.CheckProblem
}

// CheckNamespace checks meta's own records.
func (s *Service) CheckNamespace(repair bool) (nsCheck, error) {
	var out nsCheck
	s.mu.RLock()
	out.Files, out.Dirs = s.ctr.Files, s.ctr.Dirs
	s.mu.RUnlock()
	if err := s.Check(); err != nil {
		var errs interface{ Unwrap() []error }
		pr := metaapi.CheckProblem{Kind: metaapi.CheckMetadata}
		if errors.As(err, &errs) {
			for _, e := range errs.Unwrap() {
				pr.Count++
				if len(pr.Examples) < metaapi.MaxCheckExamples {
					pr.Examples = append(pr.Examples, e.Error())
				}
			}
		}
		out.Problems = append(out.Problems, pr)
	}
	return out, nil
}
