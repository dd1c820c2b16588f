package advisorylock_test

import (
	"testing"

	"github.com/advisorylock/advisorylock"
)

// The vectors were computed independently, in Python:
// int.from_bytes(sha256(b"advisorylock:v1\x00" + name).digest()[:8], "big", signed=True)
// They cover the empty name, a NUL inside a name (the domain's separator),
// SQL metacharacters and bytes that are not UTF-8, which Key takes as
// they are. (A fuzz target that recomputed the formula would only repeat
// Key's own code; the fixed vectors are the contract.)
func TestKeyIsStableAcrossVersionsAndLanguages(t *testing.T) {
	for name, want := range map[string]int64{
		"":                     1334222246599139991,
		"a":                    -5802717410584021883,
		"nightly-cleanup":      -8994055422557845183,
		"daily-digest":         6074357047860495937,
		"ünïcødé 🔒":            3646448569030897307,
		"\x00":                 -7576192791694536204,
		"a\x00b":               -3081085482789582765,
		"x'; DROP TABLE t; --": -3977114095498256310,
		"\xff":                 -8366212988963597266,
	} {
		if got := advisorylock.Key(name); got != want {
			t.Errorf("Key(%q) = %d, want %d", name, got, want)
		}
	}
}
