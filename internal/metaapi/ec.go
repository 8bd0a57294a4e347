package metaapi

import "fmt"

// ErasureCode is a systematic Reed-Solomon code RS(Data, Parity). A file
// is cut into stripes of Data cells of Cell bytes each; the stripe's
// Parity parity cells are computed from them, and the Data+Parity units
// of a stripe group live on as many distinct nodes. Any Data of the units
// rebuild the rest.
type ErasureCode struct {
	Data   int   `json:"data"`
	Parity int   `json:"parity"`
	Cell   int64 `json:"cell"` // bytes of a stripe on each unit
}

// Erasure-code limits. Units are bounded by what one capability and one
// write header can name; cells by alignment and by memory per stripe.
const (
	MaxECUnits    = 32
	MinECCell     = 512
	MaxECCell     = 4 << 20
	DefaultECCell = 64 << 10
	MaxECStripe   = 32 << 20 // data bytes of one stripe (K·cell)
	// ECUnitTarget is about how many bytes of each unit one stripe group
	// (one chunk of an erasure-coded file) holds.
	ECUnitTarget = 16 << 20
)

// ParseEC parses "K+M" (for example "4+2").
func ParseEC(s string) (ErasureCode, error) {
	var k, m int
	var rest string
	if n, _ := fmt.Sscanf(s, "%d+%d%s", &k, &m, &rest); n != 2 {
		return ErasureCode{}, Errorf(EINVAL, "erasure code %q is not K+M (for example 4+2)", s)
	}
	ec := ErasureCode{Data: k, Parity: m, Cell: DefaultECCell}
	return ec, ec.Validate()
}

func (e ErasureCode) String() string { return fmt.Sprintf("%d+%d", e.Data, e.Parity) }

// Units is the number of units of a stripe: data and parity.
func (e ErasureCode) Units() int { return e.Data + e.Parity }

// Validate checks the code on its own (not against the cluster size).
func (e ErasureCode) Validate() error {
	switch {
	case e.Data < 1 || e.Parity < 1:
		return Errorf(EINVAL, "erasure code %d+%d: K and M must each be at least 1", e.Data, e.Parity)
	case e.Data+e.Parity > MaxECUnits:
		return Errorf(EINVAL, "erasure code %d+%d: at most %d units (K+M) per stripe", e.Data, e.Parity, MaxECUnits)
	case e.Cell < MinECCell || e.Cell > MaxECCell || e.Cell%MinECCell != 0:
		return Errorf(EINVAL, "erasure code cell of %d bytes: must be a multiple of %d between %d and %d", e.Cell, MinECCell, MinECCell, MaxECCell)
	case int64(e.Data)*e.Cell > MaxECStripe:
		// A client buffers whole stripes (writes from a stream, updates).
		return Errorf(EINVAL, "erasure code %d+%d with %d-byte cells: a stripe of %d bytes, at most %d", e.Data, e.Parity, e.Cell, int64(e.Data)*e.Cell, MaxECStripe)
	}
	return nil
}

// ChunkSize is the file bytes one stripe group of this code holds: Data
// units of about ECUnitTarget bytes, a whole number of cells each.
func (e ErasureCode) ChunkSize() int64 {
	return int64(e.Data) * e.Cell * max(1, ECUnitTarget/e.Cell)
}
