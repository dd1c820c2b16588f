package dbutil

// Unexported functions the external tests measure.
var ProbeRound = probeRound
