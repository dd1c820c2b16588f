// Command schemata compiles many mutations of a Go tree into the tree
// itself (mutant schemata), switched at run time by an environment
// variable, so that a package's test binary is built once for all of its
// mutations and each mutation is one run of that binary.
//
//	schemata -tree DIR [-env NAME] MANIFEST
//
// DIR is a copy of the pristine tree; schemata rewrites it in place.
// Each line of MANIFEST is "ID<TAB>FILE<TAB>MUTATED": ID a positive
// number, FILE a path relative to DIR, MUTATED a file holding FILE's text
// with the mutation applied. For every line schemata prints
// "ID<TAB>schema<TAB>DIR-OF-FILE" or "ID<TAB>classic<TAB>why".
//
// A mutation is schema-able when its file parses and it changes only the
// bodies of top-level functions and methods and the values of top-level
// constants and variables. Each changed function gets a copy with the
// mutated body, named mutantID_NAME, appended to its file; the original's
// body begins with a switch that calls the copy when the environment
// variable (ADVISORYLOCK_MUTANT by default) holds ID. A changed value of a
// variable X becomes mutantSchemataPick(VALUE, ID, mutantID_X), with
// mutantID_X a variable holding the mutated value appended to the file. A
// changed constant becomes such a variable: its spec is blanked in place
// (its lines kept) and "var X = mutantSchemataPick(...)" appended, and so
// does every constant of the file whose value names it. A mutated value
// is computed at initialisation whichever mutant runs: one that panics
// there fails every run (mutate.sh's check with no mutant then stops the
// run). Nothing moves in the original lines, so file:line positions stay
// as they were and, with the variable unset, the program does what the
// pristine one does. Every other mutation is left for a build of its own
// ("classic"): one in a file that is not Go or is a test, one that
// changes a signature, a type or the names declared, one of a value that
// uses iota, or of a constant whose group has a spec without values.
//
// With -build, schemata then builds each module that holds a value
// mutation (go build ./... in its folder, the nearest with a go.mod): a
// constant turned variable may be used where only a constant will do (an
// array length, a constant of another file or package, untyped
// arithmetic). Where the build fails, the value mutations whose names the
// errors name (else those of the packages that failed, else all) are left
// classic ("the schemata do not build with its values switched"), and the
// rest are compiled again.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// mutation is one line of the manifest.
type mutation struct {
	id      int
	file    string
	mutated []byte
}

// verdict is what schemata decided for one mutation.
type verdict struct {
	id     int
	schema bool
	detail string   // the package folder (schema) or why not (classic)
	names  []string // the variables it changes or constants it makes variables
}

func main() {
	tree := flag.String("tree", "", "the tree to rewrite (a copy of the pristine one)")
	env := flag.String("env", "ADVISORYLOCK_MUTANT", "the environment variable that selects the mutant")
	build := flag.Bool("build", false, "build the module and leave classic the value mutations of a package that does not build")
	flag.Parse()
	if *tree == "" || flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: schemata -tree DIR [-env NAME] MANIFEST")
		os.Exit(2)
	}
	muts, err := readManifest(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, "schemata:", err)
		os.Exit(1)
	}
	verdicts, err := rewriteBuilt(*tree, *env, muts, *build)
	if err != nil {
		fmt.Fprintln(os.Stderr, "schemata:", err)
		os.Exit(1)
	}
	for _, v := range verdicts {
		kind := "classic"
		if v.schema {
			kind = "schema"
		}
		fmt.Printf("%d\t%s\t%s\n", v.id, kind, v.detail)
	}
}

func readManifest(path string) ([]mutation, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var muts []mutation
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), "\t")
		if len(fields) != 3 {
			return nil, fmt.Errorf("%s: want ID<TAB>FILE<TAB>MUTATED, got %q", path, sc.Text())
		}
		id, err := strconv.Atoi(fields[0])
		if err != nil || id <= 0 {
			return nil, fmt.Errorf("%s: bad ID %q", path, fields[0])
		}
		text, err := os.ReadFile(fields[2])
		if err != nil {
			return nil, err
		}
		muts = append(muts, mutation{id, filepath.ToSlash(fields[1]), text})
	}
	return muts, sc.Err()
}

// rewriteBuilt is rewrite, and with build, rewrite again without the
// value mutations the build fails for, until it builds.
func rewriteBuilt(tree, env string, muts []mutation, build bool) ([]verdict, error) {
	var ex exclusion
	pristine := map[string][]byte{}
	for {
		verdicts, err := rewrite(tree, env, muts, ex, pristine)
		if err != nil || !build {
			return verdicts, err
		}
		var values []verdict
		for _, v := range verdicts {
			if v.schema && len(v.names) > 0 {
				values = append(values, v)
			}
		}
		if len(values) == 0 {
			return verdicts, nil
		}
		modules := map[string]bool{}
		for _, v := range values {
			modules[moduleOf(tree, v.detail)] = true
		}
		failed, out, err := buildFailures(tree, modules)
		if err != nil {
			return nil, err
		}
		if len(failed) == 0 {
			return verdicts, nil
		}
		fmt.Fprintf(os.Stderr, "schemata: with values switched, the module does not build:\n%s", out)
		// Leave classic the mutations whose names the errors name; if
		// none, all value mutations of the packages that failed; if
		// none (a package that uses them failed), all.
		ex = ex.more()
		n := len(ex.ids) + len(ex.dirs)
		for _, v := range values {
			for _, name := range v.names {
				if regexp.MustCompile(`\b` + regexp.QuoteMeta(name) + `\b`).Match(out) {
					ex.ids[v.id] = true
				}
			}
		}
		if len(ex.ids)+len(ex.dirs) == n {
			for _, v := range values {
				if failed[v.detail] {
					ex.dirs[v.detail] = true
				}
			}
		}
		if len(ex.ids)+len(ex.dirs) == n {
			for _, v := range values {
				ex.dirs[v.detail] = true
			}
		}
	}
}

// exclusion names the value mutations rewrite leaves classic: by ID,
// and all of a folder.
type exclusion struct {
	ids  map[int]bool
	dirs map[string]bool
}

func (ex exclusion) more() exclusion {
	if ex.ids == nil {
		ex.ids, ex.dirs = map[int]bool{}, map[string]bool{}
	}
	return ex
}

// buildFailures builds each module (a folder of tree with a go.mod) and
// returns the folders, relative to tree, of the packages that failed.
func buildFailures(tree string, modules map[string]bool) (map[string]bool, []byte, error) {
	failed := map[string]bool{}
	var outs []byte
	for dir := range modules {
		mod, err := os.ReadFile(filepath.Join(tree, dir, "go.mod"))
		if err != nil {
			return nil, nil, err
		}
		m := regexp.MustCompile(`(?m)^module\s+(\S+)`).FindSubmatch(mod)
		if m == nil {
			return nil, nil, fmt.Errorf("%s/go.mod names no module", dir)
		}
		cmd := exec.Command("go", "build", "-o", os.DevNull, "./...")
		cmd.Dir = filepath.Join(tree, dir)
		out, err := cmd.CombinedOutput()
		if err == nil {
			continue
		}
		outs = append(outs, out...)
		n := len(failed)
		for _, p := range regexp.MustCompile(`(?m)^# (\S+)`).FindAllSubmatch(out, -1) {
			path := string(p[1])
			switch {
			case path == string(m[1]):
				failed[dir] = true
			case strings.HasPrefix(path, string(m[1])+"/"):
				failed[filepath.ToSlash(filepath.Join(dir, strings.TrimPrefix(path, string(m[1])+"/")))] = true
			}
		}
		if len(failed) == n {
			return nil, out, fmt.Errorf("go build ./... in %s: %v\n%s", cmd.Dir, err, out)
		}
	}
	return failed, outs, nil
}

// moduleOf is the folder of the module (the nearest go.mod) that holds
// folder dir of tree.
func moduleOf(tree, dir string) string {
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(tree, d, "go.mod")); err == nil || d == "." || d == "/" {
			return filepath.ToSlash(d)
		}
	}
}

// rewrite writes the schemata of muts into tree and says which
// mutations it took; the value mutations ex names it leaves classic. It
// keeps in pristine (when not nil) each file's text before its first
// rewrite, and starts from there when called again.
func rewrite(tree, env string, muts []mutation, ex exclusion, pristine map[string][]byte) ([]verdict, error) {
	byFile := map[string][]mutation{}
	for _, m := range muts {
		byFile[m.file] = append(byFile[m.file], m)
	}
	var verdicts []verdict
	pkgs := map[string]string{} // folder -> package name, of the files rewritten
	files := make([]string, 0, len(byFile))
	for f := range byFile {
		files = append(files, f)
	}
	sort.Strings(files)
	for _, file := range files {
		path := filepath.Join(tree, filepath.FromSlash(file))
		src, ok := pristine[path]
		if !ok {
			var err error
			if src, err = os.ReadFile(path); err != nil {
				return nil, err
			}
			if pristine != nil {
				pristine[path] = src
			}
		}
		out, pkg, vs := schemataOf(file, src, byFile[file], ex)
		verdicts = append(verdicts, vs...)
		if out == nil {
			out = src // as it was, if an earlier try rewrote it
		} else {
			pkgs[filepath.Dir(path)] = pkg
		}
		if err := os.WriteFile(path, out, 0o644); err != nil {
			return nil, err
		}
	}
	for dir, pkg := range pkgs {
		text := fmt.Sprintf(selectorFile, pkg, env)
		if err := os.WriteFile(filepath.Join(dir, "zz_mutant_schemata.go"), []byte(text), 0o644); err != nil {
			return nil, err
		}
	}
	sort.Slice(verdicts, func(i, j int) bool { return verdicts[i].id < verdicts[j].id })
	return verdicts, nil
}

// selectorFile declares, in each rewritten package, the number of the
// mutant the process runs (0: none).
const selectorFile = `// Code generated by scripts/schemata. DO NOT EDIT.

package %s

import (
	"os"
	"strconv"
)

var mutantSchemataID = func() int {
	n, _ := strconv.Atoi(os.Getenv(%q))
	return n
}()

// mutantSchemataPick is alt in mutant id, and orig otherwise.
func mutantSchemataPick[T any](orig T, id int, alt T) T {
	if mutantSchemataID == id {
		return alt
	}
	return orig
}
`

// change is one mutated copy of one function.
type change struct {
	id   int
	text string // the copy's declaration, renamed
}

// valChange is one mutated value of a constant or variable.
type valChange struct {
	id   int
	text string // the mutated value
}

// value is one value of a top-level constant or variable spec: its
// Values[i], naming Names[i].
type value struct {
	decl *ast.GenDecl
	spec *ast.ValueSpec
	i    int
}

func (v value) name() string { return v.spec.Names[v.i].Name }

// schemataOf rewrites one file for its mutations. It returns nil when it
// took none of them. The value mutations ex names it leaves classic.
func schemataOf(file string, src []byte, muts []mutation, ex exclusion) (out []byte, pkg string, vs []verdict) {
	classic := func(id int, why string) { vs = append(vs, verdict{id: id, detail: why}) }
	if !strings.HasSuffix(file, ".go") || strings.HasSuffix(file, "_test.go") {
		for _, m := range muts {
			classic(m.id, "not a Go file (or a test file)")
		}
		return nil, "", vs
	}
	fset := token.NewFileSet()
	orig, err := parser.ParseFile(fset, file, src, parser.ParseComments|parser.SkipObjectResolution)
	if err != nil {
		for _, m := range muts {
			classic(m.id, "the pristine file does not parse")
		}
		return nil, "", vs
	}
	funcs, vals := topFuncs(orig), topValues(orig)
	changes := map[int][]change{}       // index in funcs -> copies
	valChanges := map[int][]valChange{} // index in vals -> mutated values
	converted := map[*ast.ValueSpec]bool{}
	for _, m := range muts {
		cs, vcs, why := changesOf(fset, src, funcs, vals, m)
		if why == "" && len(vcs) > 0 && (ex.ids[m.id] || ex.dirs[filepath.Dir(file)]) {
			why = "the schemata do not build with its values switched"
		}
		var conv map[*ast.ValueSpec]bool
		if why == "" && len(vcs) > 0 {
			conv, why = conversions(vals, vcs)
		}
		if why != "" {
			classic(m.id, why)
			continue
		}
		for i, c := range cs {
			changes[i] = append(changes[i], c)
		}
		for i, c := range vcs {
			valChanges[i] = append(valChanges[i], c)
		}
		var names []string
		for sp := range conv {
			converted[sp] = true
			for _, n := range sp.Names {
				names = append(names, n.Name)
			}
		}
		for i := range vcs {
			names = append(names, vals[i].name())
		}
		vs = append(vs, verdict{m.id, true, filepath.Dir(file), names})
	}
	if len(changes) == 0 && len(valChanges) == 0 {
		return nil, "", vs
	}
	var edits []edit
	var tail strings.Builder
	idx := make([]int, 0, len(changes))
	for i := range changes {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	for _, i := range idx {
		edits = append(edits, dispatch(fset, funcs[i], changes[i])...)
		for _, c := range changes[i] {
			tail.WriteString("\n" + c.text + "\n")
		}
	}
	// A changed variable's value picks its mutants' values; a converted
	// constant's spec is blanked and declared again, as a variable, at the
	// end of the file.
	picked := map[*ast.ValueSpec][]string{}
	for i, v := range vals {
		text := string(src[offset(fset, v.spec.Values[v.i].Pos()):offset(fset, v.spec.Values[v.i].End())])
		typ := ""
		if v.spec.Type != nil {
			typ = " " + string(src[offset(fset, v.spec.Type.Pos()):offset(fset, v.spec.Type.End())])
		}
		for _, c := range valChanges[i] {
			alt := fmt.Sprintf("mutant%d_%s", c.id, v.name())
			fmt.Fprintf(&tail, "\nvar %s%s = %s\n", alt, typ, c.text)
			text = fmt.Sprintf("mutantSchemataPick(%s, %d, %s)", text, c.id, alt)
		}
		switch {
		case converted[v.spec]:
			picked[v.spec] = append(picked[v.spec], text)
		case len(valChanges[i]) > 0:
			at := offset(fset, v.spec.Values[v.i].Pos())
			edits = append(edits, edit{at, offset(fset, v.spec.Values[v.i].End()) - at, text})
		}
	}
	for _, v := range vals {
		if !converted[v.spec] || v.i != 0 {
			continue
		}
		from := v.spec.Pos()
		if !v.decl.Lparen.IsValid() {
			from = v.decl.Pos()
		}
		at, end := offset(fset, from), offset(fset, v.spec.End())
		edits = append(edits, edit{at, end - at, strings.Repeat("\n", bytes.Count(src[at:end], []byte("\n")))})
		names := make([]string, len(v.spec.Names))
		for j, n := range v.spec.Names {
			names[j] = n.Name
		}
		typ := ""
		if v.spec.Type != nil {
			typ = " " + string(src[offset(fset, v.spec.Type.Pos()):offset(fset, v.spec.Type.End())])
		}
		fmt.Fprintf(&tail, "\nvar %s%s = %s\n", strings.Join(names, ", "), typ, strings.Join(picked[v.spec], ", "))
	}
	out = apply(src, edits)
	out = append(out, tail.String()...)
	return out, orig.Name.Name, vs
}

// conversions lists the constant specs that become variables for the
// changed values vcs (index in vals): the changed constants' and, again
// and again, those of every constant of the file whose value names one.
// It says why not when one of them cannot (its group has a spec without
// values, or uses iota).
func conversions(vals []value, vcs map[int]valChange) (map[*ast.ValueSpec]bool, string) {
	conv := map[*ast.ValueSpec]bool{}
	names := map[string]bool{}
	add := func(sp *ast.ValueSpec) {
		conv[sp] = true
		for _, n := range sp.Names {
			names[n.Name] = true
		}
	}
	for i := range vcs {
		if vals[i].decl.Tok == token.CONST {
			add(vals[i].spec)
		}
	}
	for grown := true; grown; {
		grown = false
		for _, v := range vals {
			if v.decl.Tok != token.CONST || conv[v.spec] || !mentions(v.spec.Values[v.i], names) {
				continue
			}
			add(v.spec)
			grown = true
		}
	}
	for _, v := range vals {
		if !conv[v.spec] {
			continue
		}
		for _, sp := range v.decl.Specs {
			sp := sp.(*ast.ValueSpec)
			if len(sp.Values) != len(sp.Names) {
				return nil, fmt.Sprintf("constant %s would become a variable, but a spec of its group has no values of its own", v.name())
			}
			for _, x := range sp.Values {
				if mentions(x, map[string]bool{"iota": true}) {
					return nil, fmt.Sprintf("constant %s would become a variable, but its group uses iota", v.name())
				}
			}
		}
	}
	return conv, ""
}

// mentions says whether x names one of names (not as a field or method).
func mentions(x ast.Expr, names map[string]bool) bool {
	found := false
	ast.Inspect(x, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.SelectorExpr:
			ast.Inspect(n.X, func(n ast.Node) bool {
				if id, ok := n.(*ast.Ident); ok && names[id.Name] {
					found = true
				}
				return !found
			})
			return false
		case *ast.Ident:
			found = found || names[n.Name]
		}
		return !found
	})
	return found
}

// topFuncs lists the file's top-level functions that have bodies.
func topFuncs(f *ast.File) []*ast.FuncDecl {
	var fs []*ast.FuncDecl
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
			fs = append(fs, fd)
		}
	}
	return fs
}

// topValues lists the values of the file's top-level constants and
// variables.
func topValues(f *ast.File) []value {
	var vs []value
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || (gd.Tok != token.CONST && gd.Tok != token.VAR) {
			continue
		}
		for _, sp := range gd.Specs {
			sp := sp.(*ast.ValueSpec)
			for i := range sp.Values {
				vs = append(vs, value{gd, sp, i})
			}
		}
	}
	return vs
}

// changesOf finds the functions mutation m changes (by their index in
// funcs) and makes their copies, and finds the values it changes (by
// their index in vals), or says why m cannot be a schema.
func changesOf(fset *token.FileSet, src []byte, funcs []*ast.FuncDecl, vals []value, m mutation) (map[int]change, map[int]valChange, string) {
	mfset := token.NewFileSet()
	mf, err := parser.ParseFile(mfset, m.file, m.mutated, parser.ParseComments|parser.SkipObjectResolution)
	if err != nil {
		return nil, nil, "the mutated file does not parse"
	}
	mfuncs, mvals := topFuncs(mf), topValues(mf)
	if len(mfuncs) != len(funcs) || len(mvals) != len(vals) ||
		!bytes.Equal(skeleton(fset, src, funcs, vals), skeleton(mfset, m.mutated, mfuncs, mvals)) {
		return nil, nil, "it changes code outside function bodies and values"
	}
	cs := map[int]change{}
	for i, fd := range funcs {
		if bytes.Equal(body(fset, src, fd), body(mfset, m.mutated, mfuncs[i])) {
			continue
		}
		if why := unfaithful(fd); why != "" {
			return nil, nil, fmt.Sprintf("%s %s", fd.Name.Name, why)
		}
		mfd := mfuncs[i]
		start, end := offset(mfset, mfd.Type.Func), offset(mfset, mfd.End())
		nameAt, nameEnd := offset(mfset, mfd.Name.Pos()), offset(mfset, mfd.Name.End())
		text := string(m.mutated[start:nameAt]) + copyName(m.id, fd) + string(m.mutated[nameEnd:end])
		cs[i] = change{m.id, text}
	}
	vcs := map[int]valChange{}
	for i, v := range vals {
		x, mx := v.spec.Values[v.i], mvals[i].spec.Values[v.i]
		before := src[offset(fset, x.Pos()):offset(fset, x.End())]
		after := m.mutated[offset(mfset, mx.Pos()):offset(mfset, mx.End())]
		if bytes.Equal(before, after) {
			continue
		}
		switch {
		case len(v.spec.Values) != len(v.spec.Names):
			return nil, nil, fmt.Sprintf("it changes a value of %s, whose spec has fewer values than names", v.name())
		case v.name() == "_":
			return nil, nil, "it changes the value of a blank variable"
		case mentions(x, map[string]bool{"iota": true}) || mentions(mx, map[string]bool{"iota": true}):
			return nil, nil, fmt.Sprintf("it changes the value of %s, which uses iota", v.name())
		}
		vcs[i] = valChange{m.id, string(after)}
	}
	if len(cs) == 0 && len(vcs) == 0 {
		return nil, nil, "it changes no function body or value"
	}
	return cs, vcs, ""
}

// unfaithful says why a copy of fd would not behave as fd mutated would
// (it runs one frame deeper), or "".
func unfaithful(fd *ast.FuncDecl) string {
	why := ""
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			return false // a closure's frame is its own either way
		case *ast.CallExpr:
			if id, ok := n.Fun.(*ast.Ident); ok && id.Name == "recover" {
				why = "calls recover (only a deferred function's own frame recovers)"
			}
		case *ast.SelectorExpr:
			if x, ok := n.X.(*ast.Ident); ok && x.Name == "runtime" && strings.HasPrefix(n.Sel.Name, "Caller") {
				why = "reads its callers' frames"
			}
		}
		return why == ""
	})
	return why
}

// skeleton is the file's text with every function body and every value
// of a top-level constant or variable cut out.
func skeleton(fset *token.FileSet, src []byte, funcs []*ast.FuncDecl, vals []value) []byte {
	type cut struct{ from, to int }
	var cuts []cut
	for _, fd := range funcs {
		cuts = append(cuts, cut{offset(fset, fd.Body.Lbrace) + 1, offset(fset, fd.Body.Rbrace)})
	}
	for _, v := range vals {
		x := v.spec.Values[v.i]
		cuts = append(cuts, cut{offset(fset, x.Pos()), offset(fset, x.End())})
	}
	slices.SortFunc(cuts, func(a, b cut) int { return a.from - b.from })
	var b []byte
	last := 0
	for _, c := range cuts {
		b = append(b, src[last:c.from]...)
		b = append(b, 0)
		last = c.to
	}
	return append(b, src[last:]...)
}

func body(fset *token.FileSet, src []byte, fd *ast.FuncDecl) []byte {
	return src[offset(fset, fd.Body.Lbrace):offset(fset, fd.Body.Rbrace)]
}

func offset(fset *token.FileSet, p token.Pos) int { return fset.Position(p).Offset }

func copyName(id int, fd *ast.FuncDecl) string {
	return fmt.Sprintf("mutant%d_%s", id, fd.Name.Name)
}

// edit replaces src[at:at+n] with text.
type edit struct {
	at, n int
	text  string
}

func apply(src []byte, edits []edit) []byte {
	slices.SortFunc(edits, func(a, b edit) int { return b.at - a.at })
	out := slices.Clone(src)
	for _, e := range edits {
		out = slices.Concat(out[:e.at], []byte(e.text), out[e.at+e.n:])
	}
	return out
}

// dispatch names fd's unnamed and blank parameters (so they can be passed
// on) and begins its body with a switch to its copies, on the line of its
// opening brace.
func dispatch(fset *token.FileSet, fd *ast.FuncDecl, cs []change) []edit {
	var edits []edit
	name := func(fields *ast.FieldList, prefix string) []string {
		var names []string
		if fields == nil {
			return nil
		}
		for i, f := range fields.List {
			if len(f.Names) == 0 {
				n := fmt.Sprintf("%s%d", prefix, i)
				edits = append(edits, edit{offset(fset, f.Type.Pos()), 0, n + " "})
				names = append(names, n)
				continue
			}
			for j, id := range f.Names {
				n := id.Name
				if n == "_" {
					n = fmt.Sprintf("%s%d_%d", prefix, i, j)
					edits = append(edits, edit{offset(fset, id.Pos()), 1, n})
				}
				names = append(names, n)
			}
		}
		return names
	}
	recv := name(fd.Recv, "mutantRecv")
	params := name(fd.Type.Params, "mutantParam")
	if n := len(fd.Type.Params.List); n > 0 {
		if _, ok := fd.Type.Params.List[n-1].Type.(*ast.Ellipsis); ok {
			params[len(params)-1] += "..."
		}
	}
	var targs []string
	if fd.Type.TypeParams != nil {
		for _, f := range fd.Type.TypeParams.List {
			for _, id := range f.Names {
				targs = append(targs, id.Name)
			}
		}
	}
	results := fd.Type.Results != nil && len(fd.Type.Results.List) > 0
	var b strings.Builder
	b.WriteString(" if mutantSchemataID != 0 { switch mutantSchemataID {")
	for _, c := range cs {
		call := copyName(c.id, fd)
		if len(recv) > 0 {
			call = recv[0] + "." + call
		}
		if len(targs) > 0 {
			call += "[" + strings.Join(targs, ", ") + "]"
		}
		call += "(" + strings.Join(params, ", ") + ")"
		if results {
			fmt.Fprintf(&b, " case %d: return %s;", c.id, call)
		} else {
			fmt.Fprintf(&b, " case %d: %s; return;", c.id, call)
		}
	}
	b.WriteString(" } };")
	edits = append(edits, edit{offset(fset, fd.Body.Lbrace) + 1, 0, b.String()})
	return edits
}
