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

// ExampleCache puts the optional block cache on a session of its own,
// with the application's policy: read-ahead of 4 blocks on sequential
// reads, write-behind in batches, and a DontNeed hint.
func ExampleCache() {
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
	f, _ := cl.Create(ctx, "/log", 0o644)

	s := dafs.New(cl, dafs.Options{})
	defer s.Close()
	cache, err := dafs.NewCache(s, dafs.CacheOptions{BlockSize: 4096, Bytes: 1 << 20, ReadAhead: 4, WriteBehind: 8 * 4096})
	if err != nil {
		fmt.Println(err)
		return
	}
	for i := range 16 { // lands in the cache; written back 8 blocks at a time
		cache.WriteAt(ctx, f, []byte(fmt.Sprintf("%-4096s", fmt.Sprintf("record %d", i))), int64(i)*4096)
	}
	if err := cache.Flush(ctx); err != nil { // durable on the nodes once nil
		fmt.Println(err)
		return
	}
	fmt.Println("writes:", cache.Stats().Writes, "submits:", cache.Stats().Submits)
	cache.DontNeed(f, 0, 0) // drop the file's blocks: reads go to the nodes again
	p := make([]byte, 8)
	for i := range 8 { // sequential: blocks ahead are fetched before they are asked for
		cache.ReadAt(ctx, f, p, int64(i)*4096)
	}
	fmt.Printf("%s\n", p)
	fmt.Println("read ahead, then read:", cache.Stats().PrefetchHits)
	fmt.Println(cache.Close(ctx))
	// Output:
	// writes: 16 submits: 2
	// record 7
	// read ahead, then read: 7
	// <nil>
}
