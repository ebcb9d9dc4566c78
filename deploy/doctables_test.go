package deploy

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// Every row of a flags table (a table with a Flag and a Default column,
// in docs/*.md and the READMEs) gives each of its flags the default the
// binary's --help prints, and a service's README, or the gateway's, has
// a row for every flag its binary has. A default --help cannot print (a
// service's own QPS when the flag is 0) carries a <!-- const: ... -->
// marker naming the constant that holds it. docs/compatibility.md's
// table of csi-provisioner's flags is internal/csisidecar's to check
// (TestFlagsMatchDocs).
//
// The tables stay hand-written, with the reasons a --help line has no
// room for; this test, not a generator, keeps them true.
func TestFlagTablesMatchHelp(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every binary")
	}
	help := helpOfEveryBinary(t)
	consts := newConstReader("..")
	checked := 0
	for _, f := range figureDocs(t) {
		if strings.HasSuffix(f, "docs/compatibility.md") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rows := flagTableRows(string(b))
		own := ownBinary(f)
		for _, row := range rows {
			for _, e := range checkRow(row, own, help, consts) {
				t.Errorf("%s:%d: %s", f, row.line, e)
			}
			checked++
		}
		if own != "" {
			for _, e := range missingRows(rows, help[own]) {
				t.Errorf("%s: no row for %s --%s", f, own, e)
			}
		}
	}
	if checked < 100 {
		t.Errorf("only %d flags-table rows found", checked)
	}
	t.Logf("%d flags-table rows checked against --help", checked)
}

// ownBinary is the binary whose README f is, or "".
func ownBinary(f string) string {
	for _, b := range []string{"watcher", "binder", "provisioner", "reclaimer", "gateway"} {
		if strings.HasSuffix(f, "/"+b+"/README.md") {
			return b
		}
	}
	return ""
}

// missingRows are the flags of a binary no row names.
func missingRows(rows []flagRow, flags map[string]string) []string {
	named := map[string]bool{"help": true, "version": true}
	for _, r := range rows {
		for _, f := range r.flags {
			named[f] = true
		}
	}
	var out []string
	for f := range flags {
		if !named[f] {
			out = append(out, f)
		}
	}
	return out
}

// checkRow compares a row's defaults with each binary's that has the
// flag: the row's own binary, the binaries its services cell names, or
// any.
func checkRow(row flagRow, own string, help map[string]map[string]string, consts *constReader) []string {
	var errs []string
	values := rowValues(row)
	for i, flag := range row.flags {
		found := false
		for name, defs := range help {
			d, ok := defs[flag]
			if !ok || !rowNames(row, own, name) {
				continue
			}
			found = true
			v := values[""][0]
			if len(values["each"]) == len(row.flags) {
				v = values["each"][i]
			}
			if bv, ok := values[name]; ok && len(bv) == 1 {
				v = bv[0]
			}
			if msg := docDefaultDiffers(v, d, consts); msg != "" {
				errs = append(errs, "--"+flag+" of "+name+": "+msg)
			}
		}
		if !found {
			errs = append(errs, "no binary the row is for has --"+flag)
		}
	}
	return errs
}

// rowNames says whether a row is about binary name.
func rowNames(row flagRow, own, name string) bool {
	if own != "" {
		return own == name
	}
	s := row.services
	switch {
	case s == "" || s == "all":
		return true
	case strings.HasPrefix(s, "all but "):
		return !strings.Contains(s, name)
	}
	return regexp.MustCompile(`\b` + name + `\b`).MatchString(s)
}

// rowValues splits a default cell: "" is the whole cell, "each" its
// comma-separated values (one per flag of the row), and a binary's name
// the value a "binder `…:7702`" part gives that binary. "…" repeats the
// part of the value before it up to its last colon.
func rowValues(row flagRow) map[string][]string {
	out := map[string][]string{"": {row.def}}
	prev := ""
	for _, part := range strings.Split(row.def, ", ") {
		part = strings.TrimSpace(part)
		name, rest, ok := strings.Cut(part, " ")
		if ok && ownBinary("/"+name+"/README.md") != "" {
			part = rest
		}
		if strings.HasPrefix(strings.Trim(part, "`"), "…") && strings.Contains(prev, ":") {
			part = prev[:strings.LastIndex(prev, ":")] + strings.TrimPrefix(strings.Trim(part, "`"), "…")
		}
		prev = strings.Trim(part, "`")
		out["each"] = append(out["each"], part)
		if ok && ownBinary("/"+name+"/README.md") != "" {
			out[name] = []string{part}
		}
	}
	return out
}

var parenNote = regexp.MustCompile(`\s*\(.*\)\s*$`)

// docDefaultDiffers says how a doc's default differs from --help's d, or
// "": the same literal; a word for the zero value (empty, none, off,
// false, required); a value a const marker holds; or, for prose ("hostname
// plus a random suffix"), a default --help leaves to the code.
func docDefaultDiffers(doc, d string, consts *constReader) string {
	if m := figureMarker.FindStringSubmatch(doc); m != nil && m[1] == "const" {
		return constDiffers(strings.Trim(strings.TrimSpace(figureMarker.ReplaceAllString(doc, "")), "`"), m[2], consts)
	}
	v := strings.Trim(strings.TrimSpace(parenNote.ReplaceAllString(doc, "")), "`\"")
	switch strings.ToLower(v) {
	case "", "empty", "none", "required", "off", "false":
		if d == "" || d == "false" || d == "[]" {
			return ""
		}
	case "on", "true":
		if d == "true" {
			return ""
		}
	default:
		if sameDefault(v, d) || (strings.ContainsAny(v, " $") || strings.HasPrefix(v, "--")) && d == "" {
			return ""
		}
	}
	return "the doc says " + quoteEmpty(v) + ", --help " + quoteEmpty(d)
}

// constDiffers says how a doc's value differs from the constant ref, or "".
func constDiffers(doc, ref string, consts *constReader) string {
	if _, _, scaled := strings.Cut(ref, " * "); !scaled {
		if v, err := consts.text(ref); err != nil || v == doc {
			return errText(err)
		}
	}
	v, err := consts.value(ref)
	if err != nil {
		return err.Error()
	}
	if n, err := strconv.ParseFloat(doc, 64); err != nil || n != v {
		return "the doc says " + doc + ", " + ref + " is " + strconv.FormatFloat(v, 'f', -1, 64)
	}
	return ""
}

// errText is err's message, or "" for none.
func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
