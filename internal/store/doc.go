// Package store is a storage node's host side: chunks on local disk,
// written at packet offsets by the data-plane engine ("direct placement"),
// made durable before a write is acknowledged, with a CRC32C checksum per
// block and a version per chunk.
//
// # Layout
//
// Data lives in Dir/chunks/<last 2 hex digits>/<16 hex digits>.chunk, one
// sparse file per chunk. Metadata — each chunk's committed version and
// length, its block checksums and any pending redo record — lives in an
// embedded pebble database in Dir/index. Overwrites of committed bytes are
// staged in Dir/staging until they commit.
//
// # Writes
//
// A write is a transaction on one byte range of one chunk: BeginWrite,
// Place for every packet as it arrives, then Commit or Abort. Nothing of a
// write is visible until Commit returns, and a write that aborts or is cut
// short by a crash leaves the chunk exactly as it was:
//
//   - Bytes at or beyond the committed length (the "append region") go
//     straight into the chunk file. Readers stop at the committed length,
//     so they are invisible until the new length commits.
//   - Bytes below the committed length would clobber visible data, so they
//     go to a per-write staging file. Commit records a redo entry in the
//     same atomic, synced pebble batch that publishes the new version,
//     length and checksums, then copies the staged bytes into place. If
//     the process dies in between, Open replays the redo entry; the copy is
//     idempotent.
//
// Place computes each packet's CRC32C while the packet is hot in cache, so
// Commit never re-reads the write: only the at most two blocks the write
// covers partly are completed by reading their untouched committed bytes
// and combining CRCs (see crc32c.go).
//
// # Checksums
//
// Block i covers [i*B, min((i+1)*B, Length)). Checksums are kept in pages of
// 256 per pebble key so a small write rewrites about a kilobyte of metadata.
// A page is dense up to its last stored entry; a block without an entry has
// never held data and is all zeros, so a write far beyond the end of a
// chunk costs no metadata for the hole it leaves.
//
// # Concurrency
//
// At most one write per chunk is open at a time. Readers hold a chunk's
// shared lock for the life of a Read; Commit takes it exclusively only to
// switch visibility and apply staged bytes. Different chunks never contend:
// chunk states live in a sharded table and are evicted when idle.
package store
