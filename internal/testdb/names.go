package testdb

import (
	"crypto/rand"
	"encoding/hex"
	"testing"
)

// UniqueName returns a lock name unique to this test and this run, so that
// tests running at the same time against one server never share a lock.
func UniqueName(t testing.TB) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return t.Name() + "/" + hex.EncodeToString(b[:])
}
