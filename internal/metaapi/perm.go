package metaapi

// Access bits, as in access(2) (CreateReq.Open).
const (
	MayExec  = 1
	MayWrite = 2
	MayRead  = 4
)
