package store

import (
	"encoding/binary"
	"fmt"

	"github.com/sluicefs/sluice/internal/ids"
)

// Pebble key space. Every key starts with a one-byte kind; chunk IDs are
// big-endian so a chunk's keys sort together and List walks chunks in
// order.
//
//	f                   -> format: version byte, block size (u32)
//	i <id>              -> Info: version (u64), length (u64)
//	k <id> <page u32>   -> checksum page: up to crcsPerPage CRC32Cs (u32 each)
//	r <id>              -> redo record: version, offset, length (u64 each)
//	d <id>              -> doubt record: base, version, tag, offset, end (u64 each)
const (
	kindFormat = 'f'
	kindInfo   = 'i'
	kindPage   = 'k'
	kindRedo   = 'r'
	kindDoubt  = 'd'
)

// crcsPerPage is the number of block checksums per pebble key: 1 KiB
// values, so a small write rewrites about a kilobyte of metadata while a
// 1 GiB chunk of 16 KiB blocks needs only 256 keys.
const crcsPerPage = 256

const formatVersion = 1

func formatKey() []byte { return []byte{kindFormat} }

func chunkKey(kind byte, id ids.ChunkID) []byte {
	k := make([]byte, 9, 13)
	k[0] = kind
	binary.BigEndian.PutUint64(k[1:], uint64(id))
	return k
}

func infoKey(id ids.ChunkID) []byte { return chunkKey(kindInfo, id) }
func redoKey(id ids.ChunkID) []byte { return chunkKey(kindRedo, id) }

func pageKey(id ids.ChunkID, page int64) []byte {
	return binary.BigEndian.AppendUint32(chunkKey(kindPage, id), uint32(page))
}

func chunkIDFromKey(k []byte) (ids.ChunkID, error) {
	if len(k) < 9 {
		return 0, fmt.Errorf("short key %x: %w", k, ErrCorrupt)
	}
	return ids.ChunkID(binary.BigEndian.Uint64(k[1:9])), nil
}

func encodeInfo(in Info) []byte {
	v := make([]byte, 24)
	binary.BigEndian.PutUint64(v, in.Version)
	binary.BigEndian.PutUint64(v[8:], uint64(in.Length))
	binary.BigEndian.PutUint64(v[16:], in.Tag)
	return v
}

func decodeInfo(v []byte) (Info, error) {
	if len(v) != 16 && len(v) != 24 { // 16: written before tags existed
		return Info{}, fmt.Errorf("info value of %d bytes: %w", len(v), ErrCorrupt)
	}
	in := Info{
		Version: binary.BigEndian.Uint64(v),
		Length:  int64(binary.BigEndian.Uint64(v[8:])),
	}
	if len(v) == 24 {
		in.Tag = binary.BigEndian.Uint64(v[16:])
	}
	if in.Length < 0 {
		return Info{}, fmt.Errorf("info with negative length %d: %w", in.Length, ErrCorrupt)
	}
	return in, nil
}

// redoRecord says: the bytes staged for version Version of the chunk go at
// [Off, Off+Len) of the chunk file. The staging file is named by chunk and
// version (stagingPath), so a record can never be matched with another
// write's staging file.
type redoRecord struct {
	Version uint64
	Off     int64
	Len     int64
}

func (r redoRecord) encode() []byte {
	v := make([]byte, 24)
	binary.BigEndian.PutUint64(v, r.Version)
	binary.BigEndian.PutUint64(v[8:], uint64(r.Off))
	binary.BigEndian.PutUint64(v[16:], uint64(r.Len))
	return v
}

func decodeRedo(v []byte) (redoRecord, error) {
	if len(v) != 24 {
		return redoRecord{}, fmt.Errorf("redo value of %d bytes: %w", len(v), ErrCorrupt)
	}
	r := redoRecord{
		Version: binary.BigEndian.Uint64(v),
		Off:     int64(binary.BigEndian.Uint64(v[8:])),
		Len:     int64(binary.BigEndian.Uint64(v[16:])),
	}
	if r.Off < 0 || r.Len < 0 {
		return redoRecord{}, fmt.Errorf("redo record %+v: %w", r, ErrCorrupt)
	}
	return r, nil
}

// appendPage encodes CRCs little-endian onto dst.
func appendPage(dst []byte, crcs []uint32) []byte {
	for _, c := range crcs {
		dst = binary.LittleEndian.AppendUint32(dst, c)
	}
	return dst
}

// decodePage appends the CRCs in v to dst.
func decodePage(dst []uint32, v []byte) ([]uint32, error) {
	if len(v)%4 != 0 || len(v) > 4*crcsPerPage {
		return dst, fmt.Errorf("checksum page of %d bytes: %w", len(v), ErrCorrupt)
	}
	for i := 0; i < len(v); i += 4 {
		dst = append(dst, binary.LittleEndian.Uint32(v[i:]))
	}
	return dst, nil
}

func encodeFormat(blockSize int) []byte {
	v := []byte{formatVersion, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(v[1:], uint32(blockSize))
	return v
}

func decodeFormat(v []byte) (blockSize int, err error) {
	if len(v) != 5 || v[0] != formatVersion {
		return 0, fmt.Errorf("format record %x: %w", v, ErrCorrupt)
	}
	return int(binary.BigEndian.Uint32(v[1:])), nil
}
