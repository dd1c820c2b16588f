package main

import (
	"bufio"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// systemConfig is the system-wide config file. It is a variable only so
// that the tests can link another path in (-ldflags -X main.systemConfig=…).
var systemConfig = "/etc/lockrun.conf"

// setting is one key = value line of a config file.
type setting struct {
	value string
	at    string // FILE:LINE, where it was set
}

// userConfig is $XDG_CONFIG_HOME/lockrun/lockrun.conf (XDG's default for
// the config directory is ~/.config), or "" without a home.
func userConfig(getenv func(string) string) string {
	dir := getenv("XDG_CONFIG_HOME")
	if !filepath.IsAbs(dir) {
		home := getenv("HOME")
		if home == "" {
			return ""
		}
		dir = filepath.Join(home, ".config")
	}
	return filepath.Join(dir, "lockrun", "lockrun.conf")
}

// loadConfig reads the config files: only explicit if it is set (--config),
// else the system file and then the user's file, whose keys win. A file
// that does not exist is skipped; one that cannot be read, or that holds
// an unknown key or a malformed line, is a configError.
func loadConfig(explicit string, getenv func(string) string) (map[string]setting, error) {
	files := []string{systemConfig, userConfig(getenv)}
	if explicit != "" {
		files = []string{explicit}
	}
	merged := map[string]setting{}
	for _, path := range files {
		if path == "" {
			continue
		}
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) && explicit == "" {
			continue
		}
		var pathErr *fs.PathError
		if errors.As(err, &pathErr) {
			err = pathErr.Err // the reason, without the repeated path
		}
		if err != nil {
			return nil, configErrorf("cannot read config file %s: %w", path, err)
		}
		settings, err := parseConfig(path, b)
		if err != nil {
			return nil, err
		}
		for k, s := range settings {
			merged[k] = s
		}
	}
	return merged, nil
}

// parseConfig reads key = value lines; blank lines and lines starting
// with # are skipped, and a value may be quoted with " or '.
func parseConfig(path string, b []byte) (map[string]setting, error) {
	out := map[string]setting{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		at := path + ":" + strconv.Itoa(n)
		key, value, ok := strings.Cut(line, "=")
		key, value = strings.TrimSpace(key), unquote(strings.TrimSpace(value))
		switch f := lookup(func(f *flagSpec) bool { return f.config && f.long[0] == key }); {
		case !ok:
			return nil, configErrorf("%s: want key = value, got %q", at, redactDSN(line))
		case f == nil:
			return nil, configErrorf("%s: unknown key %q (known: %s)", at, key, strings.Join(configKeys(), ", "))
		case out[key].at != "":
			return nil, configErrorf("%s: %s is set twice (first at %s)", at, key, out[key].at)
		case value == "":
			return nil, configErrorf("%s: %s has no value", at, key)
		}
		out[key] = setting{value: value, at: at}
	}
	if err := sc.Err(); err != nil {
		return nil, configErrorf("config file %s: %w", path, err)
	}
	return out, nil
}

func unquote(v string) string {
	if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
		return v[1 : len(v)-1]
	}
	return v
}

// configKeys are the keys a config file may set: the long names of the
// flags marked config.
func configKeys() []string {
	var keys []string
	for _, f := range flags {
		if f.config {
			keys = append(keys, f.long[0])
		}
	}
	return keys
}

// applyConfig sets, from the config files, every flag the command line
// did not give (and no wait after -n). The DSN is chosen by chooseDSN.
func (o *options) applyConfig(settings map[string]setting) error {
	for key, s := range settings {
		if key == "dsn" || o.given[key] || (key == "wait" && o.nonblock) {
			continue
		}
		f := lookup(func(f *flagSpec) bool { return f.long[0] == key })
		if err := applySetting(o, f, s.value); err != nil {
			return configErrorf("%s: %s: bad value %q: %w", s.at, key, s.value, err)
		}
	}
	return nil
}

// applySetting sets f from a config value: true or false for a flag
// without a value.
func applySetting(o *options, f *flagSpec, value string) error {
	if f.bool == nil {
		return f.value(o, value)
	}
	on, err := strconv.ParseBool(value)
	if err != nil {
		return errors.New("want true or false")
	}
	if on {
		f.bool(o)
	}
	return nil
}
