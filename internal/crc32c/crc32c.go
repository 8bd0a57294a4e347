// Package crc32c is the checksum every block of chunk data carries, on
// disk and on the wire: CRC32C (Castagnoli). Its table is the one
// hash/crc32 recognises and computes with the CPU's CRC32 instruction.
package crc32c

import "hash/crc32"

// table is crc32's own Castagnoli table (MakeTable hands it back).
var table = crc32.MakeTable(crc32.Castagnoli)

// Checksum returns b's CRC32C.
func Checksum(b []byte) uint32 { return crc32.Checksum(b, table) }

// Update returns crc extended by b.
func Update(crc uint32, b []byte) uint32 { return crc32.Update(crc, table, b) }
