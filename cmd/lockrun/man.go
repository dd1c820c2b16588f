package main

import (
	"strings"
)

//go:generate go test -run TestManPageIsTheHelp -update-man

// manPage renders the help text as a man page (lockrun.1): each heading
// becomes a section, and every section keeps the help's lines as they are
// (no-fill), so the page says exactly what --help says. The NAME section
// is filled, as whatis(1) wants "lockrun \- summary".
func manPage(help string) string {
	var b strings.Builder
	b.WriteString(".\\\" Generated from lockrun --help by go generate; do not edit.\n")
	b.WriteString(".TH LOCKRUN 1 \"\" \"lockrun\" \"User Commands\"\n")
	nofill, blank := false, false
	for _, line := range strings.Split(strings.TrimRight(help, "\n"), "\n") {
		switch {
		case line == "":
			blank = true // written before the next text line; .SH spaces itself
			continue
		case !strings.HasPrefix(line, " "):
			if nofill {
				b.WriteString(".fi\n")
			}
			b.WriteString(".SH " + line + "\n")
			nofill = line != "NAME"
			if nofill {
				b.WriteString(".nf\n")
			}
		default:
			if blank {
				b.WriteString("\n")
			}
			b.WriteString(roffLine(strings.TrimPrefix(line, "    ")) + "\n")
		}
		blank = false
	}
	if nofill {
		b.WriteString(".fi\n")
	}
	return b.String()
}

// roffLine escapes a line of text for roff: backslashes and minus signs,
// and a leading dot or quote that roff would read as a request.
func roffLine(s string) string {
	s = strings.NewReplacer(`\`, `\e`, "-", `\-`).Replace(s)
	if strings.HasPrefix(s, ".") || strings.HasPrefix(s, "'") {
		s = `\&` + s
	}
	return s
}
