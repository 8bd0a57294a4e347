package chaos

import (
	"fmt"
	"strings"
	"time"

	"github.com/sluicefs/sluice/internal/metaapi"
)

// Report is what a run did and found.
type Report struct {
	Duration      time.Duration
	Writes        int64 // acknowledged
	WriteErrors   int64 // failed (the file keeps its old or its new bytes)
	Reads         int64 // verified reads during the run
	ReadErrors    int64 // reads that failed (unavailable, not wrong)
	WrongReads    int64 // reads that returned bytes no write produced
	NodeKills     int
	NodeRestarts  int
	MetaRestarts  int
	Repairs       int64 // chunks reconciled by meta (all its incarnations)
	RepairedBytes int64
	Files         int
	FilesLost     int   // files not readable as any acknowledged state at the end
	BytesLost     int64 // their sizes
	RepairTime    time.Duration
	// Check is what `sluice check --verify` found at the end (nothing,
	// on a healthy run).
	Check []metaapi.CheckProblem
}

func (r Report) String() string {
	return fmt.Sprintf("%s: %d writes acknowledged (%d failed), %d reads verified (%d failed, %d wrong); faults: %d node kills, %d restarts, %d meta restarts; "+
		"repairs: %d chunks, %d bytes, full redundancy %s after the faults stopped; %d files checked, %d lost, %d bytes lost; sluice check: %s",
		r.Duration.Round(time.Second), r.Writes, r.WriteErrors, r.Reads, r.ReadErrors, r.WrongReads, r.NodeKills, r.NodeRestarts, r.MetaRestarts,
		r.Repairs, r.RepairedBytes, r.RepairTime.Round(100*time.Millisecond), r.Files, r.FilesLost, r.BytesLost, describeProblems(r.Check))
}

// describeProblems is a check's findings on one line.
func describeProblems(ps []metaapi.CheckProblem) string {
	if len(ps) == 0 {
		return "clean"
	}
	var parts []string
	for _, p := range ps {
		s := fmt.Sprintf("%d %s", p.Count, p.Kind)
		if len(p.Examples) > 0 {
			s += " (" + p.Examples[0] + ")"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}
