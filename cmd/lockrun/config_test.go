package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseConfigReadsKeyValueLines(t *testing.T) {
	text := `# lockrun defaults
dsn = host=db user=app password='a b' dbname=ops

  ttl=1m
kill-after = "2.5"
lease = true
log-format = 'json'
`
	got, err := parseConfig("/etc/lockrun.conf", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]setting{
		"dsn":        {"host=db user=app password='a b' dbname=ops", "/etc/lockrun.conf:2"},
		"ttl":        {"1m", "/etc/lockrun.conf:4"},
		"kill-after": {"2.5", "/etc/lockrun.conf:5"},
		"lease":      {"true", "/etc/lockrun.conf:6"},
		"log-format": {"json", "/etc/lockrun.conf:7"},
	}
	if len(got) != len(want) {
		t.Errorf("got %d settings, want %d: %v", len(got), len(want), got)
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s = %+v, want %+v", k, got[k], w)
		}
	}
}

// An unknown key or a malformed line is an error that
// names the file and line, never skipped (and never shows a password).
func TestParseConfigRefusesWhatItDoesNotKnow(t *testing.T) {
	for text, say := range map[string]string{
		"dsn = x\nnonblock = true\n":        `/c:2: unknown key "nonblock"`,
		"ttl: 30s\n":                        `/c:1: want key = value`,
		"postgres://u:hunter22@h/db\n":      `/c:1: want key = value, got "postgres://u:xxxxx@h/db"`,
		"ttl = 1m\nttl = 2m\n":              "/c:2: ttl is set twice (first at /c:1)",
		"DSN = x\n":                         `unknown key "DSN"`,
		"help = true\n":                     `unknown key "help"`,
		"config = /etc/other.conf\n":        `unknown key "config"`,
		"verbose = true\n":                  `unknown key "verbose"`,
		"dsn = x\n\n# ok\n  wiat = 5 \n":    `/c:4: unknown key "wiat" (known: dsn, wait,`,
		"conflict-exit-code = 3\nquiet=1\n": `/c:2: unknown key "quiet"`,
		"dsn =\n":                           "/c:1: dsn has no value",
		"dsn = ''\n":                        "/c:1: dsn has no value",
	} {
		_, err := parseConfig("/c", []byte(text))
		if err == nil || codeFor(err) != exitConfig || !strings.Contains(err.Error(), say) || strings.Contains(err.Error(), "hunter22") {
			t.Errorf("config %q: %v; want a configuration error saying %q", text, err, say)
		}
	}
}

// The user's file wins over the system's; --config
// reads only its file; a file that is not there is skipped unless it was
// named; one that cannot be read is an error.
func TestLoadConfigMergesUserOverSystem(t *testing.T) {
	dir := t.TempDir()
	sys, user, explicit := filepath.Join(dir, "etc", "lockrun.conf"), filepath.Join(dir, "home", ".config", "lockrun", "lockrun.conf"), filepath.Join(dir, "x.conf")
	writeFile(t, sys, "dsn = sys\nttl = 5m\n")
	writeFile(t, user, "dsn = user\n")
	writeFile(t, explicit, "wait = 3\n")
	defer func(old string) { systemConfig = old }(systemConfig)
	systemConfig = sys
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	home := env(map[string]string{"HOME": filepath.Join(dir, "home")})

	got, err := loadConfig("", home)
	if err != nil || got["dsn"].value != "user" || got["ttl"].value != "5m" || got["ttl"].at != sys+":2" {
		t.Errorf("system + user: %v, %v; want dsn from the user's file, ttl from the system's", got, err)
	}
	got, err = loadConfig("", env(map[string]string{"HOME": "/nowhere", "XDG_CONFIG_HOME": filepath.Join(dir, "home", ".config")}))
	if err != nil || got["dsn"].value != "user" {
		t.Errorf("XDG_CONFIG_HOME: %v, %v; want the user's file found there", got, err)
	}
	got, err = loadConfig(explicit, home)
	if err != nil || len(got) != 1 || got["wait"].value != "3" {
		t.Errorf("--config: %v, %v; want its file alone", got, err)
	}
	if _, err = loadConfig(filepath.Join(dir, "missing.conf"), home); codeFor(err) != exitConfig || !strings.Contains(err.Error(), "missing.conf: no such file") {
		t.Errorf("--config naming a missing file: %v; want a configuration error", err)
	}
	systemConfig = filepath.Join(dir, "none")
	if got, err = loadConfig("", env(nil)); err != nil || len(got) != 0 {
		t.Errorf("no files, no HOME: %v, %v; want no settings and no error", got, err)
	}
	systemConfig = dir // a directory cannot be read as a file
	if _, err = loadConfig("", home); codeFor(err) != exitConfig || !strings.Contains(err.Error(), "cannot read config file "+dir) {
		t.Errorf("unreadable system file: %v; want a configuration error", err)
	}
}

// Config values are the flags' defaults: a flag given wins, -n keeps the
// file's wait from applying, and a bad value names its line.
func TestApplyConfigFillsWhatTheFlagsLeft(t *testing.T) {
	settings := map[string]setting{
		"wait": {"7", "/c:1"}, "ttl": {"2m", "/c:2"}, "lease": {"true", "/c:3"},
		"conflict-exit-code": {"9", "/c:4"}, "kill-after": {"1s", "/c:5"}, "log-format": {"json", "/c:6"},
	}
	o, err := parseArgs([]string{"-n", "--ttl", "90s", "job", "true"})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.applyConfig(settings); err != nil {
		t.Fatal(err)
	}
	if o.wait != 0 || o.ttl != 90*time.Second || !o.lease || o.conflictCode != 9 || o.killAfter != time.Second || o.logFormat != "json" {
		t.Errorf("got wait %v ttl %v lease %v -E %d kill-after %v log-format %s; want 0 90s true 9 1s json",
			o.wait, o.ttl, o.lease, o.conflictCode, o.killAfter, o.logFormat)
	}
	for key, value := range map[string]string{"ttl": "0.5", "lease": "yes please", "wait": "soon", "log-format": "xml"} {
		o, _ := parseArgs([]string{"job", "true"})
		err := o.applyConfig(map[string]setting{key: {value, "/c:9"}})
		if codeFor(err) != exitConfig || err == nil || !strings.Contains(err.Error(), "/c:9: "+key+": bad value") {
			t.Errorf("%s = %s: %v; want a configuration error naming the line", key, value, err)
		}
	}
}

// lockrun's README shows a config file and a crontab line that lockrun
// takes as they are.
func TestREADMEConfigAndCrontabLineWork(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	conf := between(t, readme, "```ini\n", "```")
	settings, err := parseConfig("README", []byte(conf))
	if err != nil || settings["dsn"].value == "" {
		t.Fatalf("the README's config file: %v, %v", settings, err)
	}
	o, _ := parseArgs([]string{"job", "true"})
	if err := o.applyConfig(settings); err != nil {
		t.Errorf("the README's config file has a bad value: %v", err)
	}
	line := strings.TrimSpace(between(t, between(t, readme, "```crontab\n", "```"), "0 3 * * *", "\n"))
	o, err = parseArgs(strings.Fields(line)[1:])
	if err != nil || o.name != "nightly-report" || !o.nonblock || o.command[0] != "/usr/local/bin/report" {
		t.Errorf("the README's crontab line %q: %+v, %v", line, o, err)
	}
}

func between(t *testing.T, s, start, end string) string {
	t.Helper()
	_, after, ok := strings.Cut(s, start)
	inside, _, ok2 := strings.Cut(after, end)
	if !ok || !ok2 {
		t.Fatalf("no %q...%q", start, end)
	}
	return inside
}

// Every key a config file may set acts as its flag
// does: the options a file's value gives equal those of the flag with
// that value, and differ from the defaults (so a key read but dropped
// fails here). A key without a case below fails too. A false boolean
// leaves its flag off; the dsn reaches chooseDSN.
func TestEveryConfigKeyActsAsItsFlag(t *testing.T) {
	cases := map[string]struct {
		value string
		flags []string
	}{
		"wait":               {"2.5", []string{"-w", "2.5"}},
		"conflict-exit-code": {"9", []string{"-E", "9"}},
		"done-exit-code":     {"3", []string{"--done-exit-code", "3"}},
		"lease":              {"true", []string{"--lease"}},
		"lease-rows":         {"true", []string{"--lease-rows"}},
		"ttl":                {"90s", []string{"--ttl", "90s"}},
		"kill-after":         {"4", []string{"--kill-after", "4"}},
		"min-hold":           {"5m", []string{"--min-hold", "5m"}},
		"slots":              {"3", []string{"--slots", "3"}},
		"log-format":         {"json", []string{"--log-format", "json"}},
	}
	command := []string{"job", "true"}
	defaults, err := parseArgs(command)
	if err != nil {
		t.Fatal(err)
	}
	defaults.given = nil
	for _, key := range configKeys() {
		if key == "dsn" {
			continue
		}
		c, ok := cases[key]
		if !ok {
			t.Errorf("config key %q has no case here: add one", key)
			continue
		}
		want, err := parseArgs(append(append([]string{}, c.flags...), command...))
		if err != nil {
			t.Fatalf("parseArgs(%q): %v", c.flags, err)
		}
		got, _ := parseArgs(command)
		if err := got.applyConfig(map[string]setting{key: {c.value, "/c:1"}}); err != nil {
			t.Fatalf("%s = %s: %v", key, c.value, err)
		}
		want.given, got.given = nil, nil
		if !reflect.DeepEqual(got, want) || reflect.DeepEqual(got, defaults) {
			t.Errorf("%s = %s in a config file gives %+v; want %+v, as %q gives (the defaults are %+v)", key, c.value, *got, *want, c.flags, *defaults)
		}
	}
	for _, f := range flags {
		if !f.config || f.bool == nil {
			continue
		}
		key := f.long[0]
		got, _ := parseArgs(command)
		if err := got.applyConfig(map[string]setting{key: {"false", "/c:1"}}); err != nil {
			t.Fatal(err)
		}
		if got.given = nil; !reflect.DeepEqual(got, defaults) {
			t.Errorf("%s = false in a config file gives %+v, want the defaults %+v", key, *got, *defaults)
		}
	}
	dsn, from, err := chooseDSN("", func(string) string { return "" }, map[string]setting{"dsn": {"postgres://db/x", "/c:2"}})
	if err != nil || dsn != "postgres://db/x" || from != "/c:2" {
		t.Errorf("chooseDSN with only a config file's dsn = %q from %q, %v; want the file's, from /c:2", dsn, from, err)
	}
}
