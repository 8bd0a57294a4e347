package crc32c

import "testing"

// The check value of CRC-32C (RFC 3720, B.4): "123456789".
func TestCheckValue(t *testing.T) {
	if got := Checksum([]byte("123456789")); got != 0xe3069283 {
		t.Fatalf("Checksum = %#x, want 0xe3069283", got)
	}
	if got := Update(Checksum([]byte("1234")), []byte("56789")); got != 0xe3069283 {
		t.Fatalf("Update = %#x, want 0xe3069283", got)
	}
}
