package main

import (
	"runtime/debug"
	"strings"
)

// version is the module version lockrun was built from (go install
// …@v1.2.3), or for a build from a checkout "(devel)" with its commit, as
// the Go toolchain recorded them.
func version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown)"
	}
	v := info.Main.Version
	if v == "" {
		v = "(devel)"
	}
	var rev, dirty string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "-dirty"
			}
		}
	}
	if rev != "" && !strings.HasPrefix(v, "v") {
		v += " " + rev[:min(len(rev), 12)] + dirty
	}
	return v + " " + info.GoVersion
}
