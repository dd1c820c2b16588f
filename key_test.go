package advisorylock_test

import (
	"crypto/sha256"
	"encoding/binary"
	"testing"

	"github.com/advisorylock/advisorylock"
)

// The vectors were computed independently, in Python:
// int.from_bytes(sha256(b"advisorylock:v1\x00" + name.encode()).digest()[:8], "big", signed=True)
func TestKeyIsStableAcrossVersionsAndLanguages(t *testing.T) {
	for name, want := range map[string]int64{
		"":                1334222246599139991,
		"nightly-cleanup": -8994055422557845183,
		"daily-digest":    6074357047860495937,
		"ünïcødé 🔒":       3646448569030897307,
	} {
		if got := advisorylock.Key(name); got != want {
			t.Errorf("Key(%q) = %d, want %d", name, got, want)
		}
	}
}

func FuzzKey(f *testing.F) {
	for _, s := range []string{"", "a", "nightly-cleanup", "\x00", "x'; DROP TABLE t; --", "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		sum := sha256.Sum256(append([]byte(advisorylock.KeyDomain+"\x00"), name...))
		want := int64(binary.BigEndian.Uint64(sum[:8]))
		if got := advisorylock.Key(name); got != want || advisorylock.Key(name) != got {
			t.Fatalf("Key(%q) = %d, want %d (and stable)", name, got, want)
		}
	})
}
