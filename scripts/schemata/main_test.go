package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/advisorylock/advisorylock/internal/testdb"
)

// fixtureMutations are edits of testdata/fixture/fixture.go, numbered
// from 1, with the verdict schemata must reach for each.
var fixtureMutations = []struct {
	old, new string
	schema   bool
}{
	{"return c.n }", "return c.n * 10 }", true},                        // value receiver
	{"c.n += k }", "c.n -= k }", true},                                 // pointer receiver, no results
	{`return "unnamed" }`, `return "UNNAMED" }`, true},                 // unnamed receiver and parameters
	{`return "blank " + s }`, `return "BLANK " + s }`, true},           // blank receiver and parameter
	{"strings.Join(parts, sep)", "strings.Join(parts[1:], sep)", true}, // variadic
	{"return xs[0], u", "return xs[1], u", true},                       // generic function
	{"return b.v }", "var zero T; return zero }", true},                // method of a generic type
	{"q = a / b\n", "q = a * b\n", true},                               // named results, bare return
	{"r = a % b\n", "r = a - b\n", true},                               // a second mutation of the same function
	{`ToUpper(s) + "!"`, `ToLower(s) + "?"`, true},                     // no results
	{"return s + s }", "return s }", true},                             // ...
	{`"recovered: %v"`, `"caught: %v"`, true},                          // recover inside a closure
	{`*out = fmt.Sprint("rescued ", r)`, `*out = "lost"`, false},       // recover in its own frame
	{`greeting = "hello"`, `greeting = "bye"`, true},                   // a constant
	{`table = "items"`, `table = "things"`, true},                      // a constant others are built from
	{"WHERE n > 1", "WHERE n >= 1", true},                              // a constant across lines
	{"WHERE n > 1", "WHERE n < 1", true},                               // ... and a second mutant of it
	{`labelB label = "b"`, `labelB label = "B"`, true},                 // a typed constant in a group
	{"second0\n", "second0 = 5\n", false},                              // a spec's values added
	{"first0 = iota", "first0 = iota + 1", false},                      // iota
	{`"%s-%d", "x", 1)`, `"%s-%d", "y", 1)`, true},                     // a variable set by a call
	{"\t\"two\",\n", "\t\"TWO\",\n", true},                             // a variable across lines
	{`"left", "right"`, `"left", "RIGHT"`, true},                       // the second of two names
	{"limit = 10", "limit = 10 + len(table)", true},                    // a new value naming another constant
}

func TestSchemataBehaveAsEachMutantAndTheOriginal(t *testing.T) {
	testdb.Slow(t, "builds and links a program per mutation (about 11 s of CPU)")
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatal("the test builds the fixture with go:", err)
	}
	src, err := os.ReadFile("testdata/fixture/fixture.go")
	if err != nil {
		t.Fatal(err)
	}
	// The fixture's module exists only in the test's copies, so the
	// repository holds no module that CI would have to name.
	mod := []byte("module fixture\n\ngo 1.24\n")
	tmp := t.TempDir()
	tree := filepath.Join(tmp, "tree")
	writeFiles(t, tree, map[string][]byte{"go.mod": mod, "fixture.go": src})
	// What the pristine fixture and each mutated one print: one module,
	// a program per folder, built in one go.
	plain := filepath.Join(tmp, "plain")
	programs := map[string][]byte{"go.mod": mod, "m0/fixture.go": src}
	var muts []mutation
	for i, fm := range fixtureMutations {
		id := i + 1
		if strings.Count(string(src), fm.old) != 1 {
			t.Fatalf("mutation %d: %q is not once in the fixture", id, fm.old)
		}
		mutated := []byte(strings.Replace(string(src), fm.old, fm.new, 1))
		muts = append(muts, mutation{id, "fixture.go", mutated})
		if fm.schema {
			programs[fmt.Sprintf("m%d/fixture.go", id)] = mutated
		}
	}
	writeFiles(t, plain, programs)
	build(t, plain, "./...")

	verdicts, err := rewrite(tree, "FIXTURE_MUTANT", muts, exclusion{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range verdicts {
		fm := fixtureMutations[v.id-1]
		if v.schema != fm.schema {
			t.Errorf("mutation %d (%q): schema %v, want %v (%s)", v.id, fm.new, v.schema, fm.schema, v.detail)
		}
	}
	build(t, tree, ".")
	for name := range programs {
		if name == "go.mod" {
			continue
		}
		id := strings.TrimPrefix(filepath.Dir(name), "m")
		want := output(t, exec.Command(filepath.Join(plain, "bin", "m"+id)))
		cmd := exec.Command(filepath.Join(tree, "bin", "fixture"))
		cmd.Env = append(os.Environ(), "FIXTURE_MUTANT="+id)
		if got := output(t, cmd); got != want {
			t.Errorf("mutant %s prints\n%s\nwant what the mutated fixture prints:\n%s", id, got, want)
		}
	}

	// The original functions keep their lines: positions in the schemata
	// are those of the pristine file.
	rewritten, err := os.ReadFile(filepath.Join(tree, "fixture.go"))
	if err != nil {
		t.Fatal(err)
	}
	before, after := strings.Split(string(src), "\n"), strings.Split(string(rewritten), "\n")
	for i, line := range before {
		if strings.HasPrefix(line, "func ") != strings.HasPrefix(after[i], "func ") {
			t.Errorf("line %d was %q, is %q", i+1, line, after[i])
		}
	}
}

// A constant that becomes a variable may be needed as a constant: with
// -build, its mutation is left classic, and the others still compiled in.
func TestSchemataLeaveClassicAConstantThatMustStayOne(t *testing.T) {
	src := `package main

import "fmt"

const size = 3

var slots [size]int

const word = "w"

func main() { fmt.Println(len(slots), word) }
`
	tree := t.TempDir()
	writeFiles(t, tree, map[string][]byte{"go.mod": []byte("module fixture\n\ngo 1.24\n"), "main.go": []byte(src)})
	muts := []mutation{
		{1, "main.go", []byte(strings.Replace(src, "size = 3", "size = 4", 1))},
		{2, "main.go", []byte(strings.Replace(src, `word = "w"`, `word = "W"`, 1))},
		{3, "main.go", []byte(strings.Replace(src, "len(slots), word", "len(slots)+1, word", 1))},
	}
	verdicts, err := rewriteBuilt(tree, "FIXTURE_MUTANT", muts, true)
	if err != nil {
		t.Fatal(err)
	}
	want := []bool{false, true, true}
	for _, v := range verdicts {
		if v.schema != want[v.id-1] {
			t.Errorf("mutation %d: schema %v, want %v (%s)", v.id, v.schema, want[v.id-1], v.detail)
		}
	}
	build(t, tree, ".")
	for id, want := range map[string]string{"0": "3 w\n", "1": "3 w\n", "2": "3 W\n", "3": "4 w\n"} {
		cmd := exec.Command(filepath.Join(tree, "bin", "fixture"))
		cmd.Env = append(os.Environ(), "FIXTURE_MUTANT="+id)
		if got := output(t, cmd); got != want {
			t.Errorf("mutant %s prints %q, want %q", id, got, want)
		}
	}
}

func output(t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, out)
	}
	return string(out)
}

func writeFiles(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	for name, text := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, text, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// build builds the programs of the module in dir into dir/bin.
func build(t *testing.T, dir, pkgs string) {
	t.Helper()
	cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "bin")+string(filepath.Separator), pkgs)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", dir, err, out)
	}
}
