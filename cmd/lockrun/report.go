package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
)

// reporter writes lockrun's own messages to stderr, one line each, with
// any secret scrubbed out: "lockrun: MESSAGE" as text, or with
// --log-format json one JSON object per line (time, level, msg, and lock
// once the lock's name is known), for log shippers.
type reporter struct {
	w       io.Writer
	quiet   bool
	verbose bool
	json    *slog.Logger // nil: text
	lock    string       // the lock's name, a field of every JSON line
	secrets []string
	cause   lossCause
}

// configure applies -q, -v and --log-format.
func (r *reporter) configure(o *options) {
	r.quiet, r.verbose, r.lock = o.quiet, o.verbose, o.name
	if o.logFormat == "json" {
		r.json = slog.New(slog.NewJSONHandler(r.w, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
}

// errorf reports an error; -q does not silence it.
func (r *reporter) errorf(format string, args ...any) { r.emit(slog.LevelError, format, args...) }

// warnf reports what the user must know of (a lost lock, a failed
// release), unless -q.
func (r *reporter) warnf(format string, args ...any) {
	if !r.quiet {
		r.emit(slog.LevelWarn, format, args...)
	}
}

// debugf reports what lockrun does, only with -v.
func (r *reporter) debugf(format string, args ...any) {
	if r.verbose && !r.quiet {
		r.emit(slog.LevelInfo, format, args...)
	}
}

func (r *reporter) emit(level slog.Level, format string, args ...any) {
	msg := scrub(fmt.Sprintf(format, args...), r.secrets)
	if r.json == nil {
		_, _ = io.WriteString(r.w, "lockrun: "+msg+"\n")
		return
	}
	var attrs []any
	if r.lock != "" {
		attrs = append(attrs, "lock", scrub(r.lock, r.secrets))
	}
	r.json.Log(context.Background(), level, msg, attrs...)
}

// logger is the library's logger: it prints nothing, since lockrun
// reports a lost lock and a failed release itself, in one line, but it
// keeps the error of the library's last warning, the cause of a loss.
func (r *reporter) logger() *slog.Logger { return slog.New(&r.cause) }

// lossCause is a slog.Handler that keeps the "err" attribute of the last
// warning. The library logs it before it closes a Lost channel.
type lossCause struct {
	mu   sync.Mutex
	last string
}

// why is the last warning's error, as " (ERROR)", or "".
func (c *lossCause) why() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == "" {
		return ""
	}
	return " (" + c.last + ")"
}

func (c *lossCause) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (c *lossCause) Handle(_ context.Context, rec slog.Record) error {
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == "err" {
			c.mu.Lock()
			c.last = strings.TrimPrefix(a.Value.String(), "advisorylock: ")
			c.mu.Unlock()
		}
		return true
	})
	return nil
}

func (c *lossCause) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *lossCause) WithGroup(string) slog.Handler      { return c }
