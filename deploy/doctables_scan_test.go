package deploy

import (
	"regexp"
	"strings"
)

// flagRow is one row of a doc's flags table: a table whose header has a
// "Flag" and a "Default" column.
type flagRow struct {
	line     int
	flags    []string // without the dashes
	def      string   // the default cell, trimmed
	defStart int      // the default cell's offsets in the doc
	defEnd   int
	services string // the "services" cell, where the table has one
}

var flagName = regexp.MustCompile("`--([a-z0-9][a-z0-9-]*)`")

// flagTableRows finds the rows of a doc's flags tables.
func flagTableRows(doc string) []flagRow {
	var rows []flagRow
	cols := map[string]int(nil)
	offset := 0
	for i, line := range strings.SplitAfter(doc, "\n") {
		start := offset
		offset += len(line)
		if !strings.HasPrefix(line, "|") {
			cols = nil
			continue
		}
		cells := tableCells(strings.TrimRight(line, "\n"))
		if cols == nil {
			cols = map[string]int{}
			for j, c := range cells {
				cols[strings.ToLower(strings.TrimSpace(c.text))] = j
			}
			continue
		}
		f, okF := cols["flag"]
		d, okD := cols["default"]
		if !okF || !okD || len(cells) <= max(f, d) || strings.HasPrefix(cells[0].text, "---") {
			continue
		}
		row := flagRow{line: i + 1, def: strings.TrimSpace(cells[d].text), defStart: start + cells[d].start, defEnd: start + cells[d].end}
		for _, m := range flagName.FindAllStringSubmatch(cells[f].text, -1) {
			row.flags = append(row.flags, m[1])
		}
		if s, ok := cols["services"]; ok && s < len(cells) {
			row.services = strings.TrimSpace(cells[s].text)
		}
		if len(row.flags) > 0 {
			rows = append(rows, row)
		}
	}
	return rows
}

// cell is one cell of a table row and its offsets in the line.
type cell struct {
	text       string
	start, end int
}

// tableCells splits a table row at the pipes outside code spans.
func tableCells(line string) []cell {
	var cells []cell
	inCode := false
	last := 0
	for i, r := range line {
		switch {
		case r == '`':
			inCode = !inCode
		case r == '|' && !inCode && (i == 0 || line[i-1] != '\\'):
			if i > 0 {
				cells = append(cells, cell{line[last+1 : i], last + 1, i})
			}
			last = i
		}
	}
	return cells
}
