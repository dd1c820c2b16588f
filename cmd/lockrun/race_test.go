//go:build race

package main

// raceEnabled builds lockrun with -race when the tests run with it.
const raceEnabled = true
