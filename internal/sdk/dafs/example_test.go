package dafs_test

import (
	"context"
	"fmt"
	"os"

	"github.com/sluicefs/sluice/internal/cluster"
	"github.com/sluicefs/sluice/internal/sdk"
	"github.com/sluicefs/sluice/internal/sdk/dafs"
)

// Example registers a buffer once, submits eight reads as one batch (one
// request per node), and reaps their completions. The cluster is an
// in-process one on loopback.
func Example() {
	dir, _ := os.MkdirTemp("", "sluice-dafs-example-")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	c, err := cluster.Start(ctx, cluster.Options{Dir: dir, Nodes: 3, MetaListen: "127.0.0.1:0"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	conf, _ := c.Conf()
	cl, err := sdk.New(sdk.Options{Conf: conf})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cl.Close()
	f, _ := cl.Create(ctx, "/records", 0o644)
	for i := range 8 {
		f.WriteAtContext(ctx, []byte(fmt.Sprintf("record %d", i)), int64(i)*4096)
	}

	s := dafs.New(cl, dafs.Options{})
	defer s.Close()
	buf, _ := s.Register(make([]byte, 8*4096)) // once, reused by every op
	var ops []*dafs.Op
	for i := 7; i >= 0; i-- {
		ops = append(ops, dafs.ReadAsync(f, int64(i)*4096, buf, i*4096, 8))
	}
	if err := s.Submit(ctx, ops...); err != nil {
		fmt.Println(err)
		return
	}
	cs, _ := s.Wait(ctx, len(ops)) // or Poll, which never blocks
	for _, c := range cs {
		fmt.Printf("%s (%d bytes, err %v)\n", buf.Bytes()[c.Op.BufOff:c.Op.BufOff+c.N], c.N, c.Err)
	}
	fmt.Println("requests:", s.Stats().Requests, "reads:", s.Stats().Reads)
	// Output:
	// record 7 (8 bytes, err <nil>)
	// record 6 (8 bytes, err <nil>)
	// record 5 (8 bytes, err <nil>)
	// record 4 (8 bytes, err <nil>)
	// record 3 (8 bytes, err <nil>)
	// record 2 (8 bytes, err <nil>)
	// record 1 (8 bytes, err <nil>)
	// record 0 (8 bytes, err <nil>)
	// requests: 1 reads: 8
}
