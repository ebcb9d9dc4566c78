package deploy

import (
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

var (
	// A duration: "1 s", "10 minutes", "250ms", "1m0s".
	durationFigure = regexp.MustCompile(`(?:^|[^\w.,])((?:\d+h)?(?:\d+m)?\d+(?:\.\d+)?\s?(ns|µs|us|ms|s|m|h|min|mins|minutes?|seconds?|hours?|milliseconds?|days?))\b`)
	// A size: "1 MiB", "80 bytes".
	sizeFigure = regexp.MustCompile(`(?:^|[^\w.,])(\d+(?:\.\d+)?\s?(bytes|KiB|MiB|GiB|KB|MB|GB))\b`)
	// A count of something the code bounds: "128 workers", "5 times".
	countFigure = regexp.MustCompile(`(?:^|[^\w.,])(\d[\d,]*\s+(workers?|times|attempts?|retries|tries|replicas?|calls?|threads?|goroutines?|entries|events?|keys|parts|members?|shards?|spans?|lines))\b`)
	// Markers: <!-- const: pkg.Name -->, <!-- flag: binary --name -->,
	// <!-- figures: why -->, <!-- figures below: why -->.
	figureMarker = regexp.MustCompile(`<!--\s*(const|flag|figures|figures below):\s*(.*?)\s*-->`)
	// What is not prose: fenced blocks, code spans, comments, link targets.
	fence    = regexp.MustCompile("(?ms)^(```|~~~).*?^(```|~~~)[^\n]*$")
	codeSpan = regexp.MustCompile("`[^`\n]*`")
	comment  = regexp.MustCompile(`(?s)<!--.*?-->`)
	linkDest = regexp.MustCompile(`\]\([^)\s]*\)`)
	heading  = regexp.MustCompile(`(?m)^(#{1,6}) `)
	// The end of a sentence: a full stop, question or exclamation mark, then a space.
	sentenceEnd = regexp.MustCompile(`[.?!]\s`)
)

// docFigures finds every figure in a doc's prose and what holds it.
func docFigures(doc string) []figure {
	prose := blank(mask(doc, fence, comment, codeSpan, linkDest), indentedCode(doc))
	figs := findFigures(doc, prose)
	for _, s := range statedAt(doc) {
		holdIn(figs, s.start, s.end, holder{kind: "stated"})
	}
	for _, row := range flagTableRows(doc) {
		holdIn(figs, row.defStart, row.defEnd, holder{kind: "stated"})
	}
	applyMarkers(doc, figs)
	out := make([]figure, len(figs))
	for i, f := range figs {
		out[i] = f.figure
	}
	return out
}

// mask blanks what the patterns match, keeping every offset and newline.
func mask(doc string, patterns ...*regexp.Regexp) string {
	b := []byte(doc)
	for _, p := range patterns {
		for _, m := range p.FindAllIndex(b, -1) {
			for i := m[0]; i < m[1]; i++ {
				if b[i] != '\n' {
					b[i] = ' '
				}
			}
		}
	}
	return string(b)
}

// blank blanks the spans of s, keeping newlines.
func blank(s string, spans [][2]int) string {
	b := []byte(s)
	for _, sp := range spans {
		for i := sp[0]; i < sp[1]; i++ {
			if b[i] != '\n' {
				b[i] = ' '
			}
		}
	}
	return string(b)
}

var listItem = regexp.MustCompile(`^\s*(?:[-*+]|\d+\.)\s`)

// indentedCode finds Markdown's indented code blocks: lines indented by
// four spaces after a blank line that does not continue a list.
func indentedCode(doc string) [][2]int {
	var spans [][2]int
	lines := strings.SplitAfter(doc, "\n")
	offset, inCode, inList := 0, false, false
	prevBlank := true
	for _, l := range lines {
		blankLine := strings.TrimSpace(l) == ""
		switch {
		case blankLine:
		case strings.HasPrefix(l, "    ") && (inCode || (prevBlank && !inList)):
			inCode = true
			spans = append(spans, [2]int{offset, offset + len(l)})
		default:
			inCode = false
			if !strings.HasPrefix(l, " ") {
				inList = listItem.MatchString(l)
			}
		}
		prevBlank = blankLine
		offset += len(l)
	}
	return spans
}

// located is a figure with its offsets in the doc.
type located struct {
	figure
	start, end int
}

// findFigures finds the figures in the masked prose, in order.
func findFigures(doc, prose string) []*located {
	var figs []*located
	add := func(re *regexp.Regexp, unit func(u string) (float64, string)) {
		for _, m := range re.FindAllStringSubmatchIndex(prose, -1) {
			text := strings.Join(strings.Fields(prose[m[2]:m[3]]), " ")
			mult, u := unit(prose[m[4]:m[5]])
			v, ok := figureNumber(text, mult, u)
			if !ok {
				continue
			}
			figs = append(figs, &located{
				figure: figure{line: 1 + strings.Count(doc[:m[2]], "\n"), text: text, value: v, unit: u},
				start:  m[2], end: m[3],
			})
		}
	}
	add(durationFigure, durationUnit)
	add(sizeFigure, sizeUnit)
	add(countFigure, func(string) (float64, string) { return 1, "" })
	sort.Slice(figs, func(i, j int) bool { return figs[i].start < figs[j].start })
	return figs
}

// figureNumber reads a figure's value: a duration Go writes ("1m0s",
// "250ms") as Go reads it, else the number before the unit times mult.
func figureNumber(text string, mult float64, unit string) (float64, bool) {
	if unit == "ns" {
		if d, err := time.ParseDuration(text); err == nil {
			return float64(d), true
		}
	}
	num, _, _ := strings.Cut(text, " ")
	num = strings.TrimRightFunc(num, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	v, err := strconv.ParseFloat(strings.ReplaceAll(num, ",", ""), 64)
	return v * mult, err == nil
}

// durationUnit is the nanoseconds in one of a duration's unit.
func durationUnit(u string) (float64, string) {
	switch strings.TrimSuffix(u, "s") {
	case "n":
		return 1, "ns"
	case "µ", "u":
		return 1e3, "ns"
	case "m", "millisecond":
		if u == "ms" || strings.HasPrefix(u, "milli") {
			return 1e6, "ns"
		}
		return 60e9, "ns"
	case "", "second":
		return 1e9, "ns"
	case "min", "minute":
		return 60e9, "ns"
	case "h", "hour":
		return 3600e9, "ns"
	case "day":
		return 86400e9, "ns"
	}
	return 1, "ns"
}

// sizeUnit is the bytes in one of a size's unit.
func sizeUnit(u string) (float64, string) {
	m := map[string]float64{"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "KB": 1e3, "MB": 1e6, "GB": 1e9}
	return m[u], "B"
}

// holdIn gives the figures between start and end a holder, unless one
// already has one.
func holdIn(figs []*located, start, end int, h holder) {
	for _, f := range figs {
		if f.start >= start && f.start < end && f.held.kind == "" {
			f.held = h
		}
	}
}

// applyMarkers reads the markers, const and flag markers first: a const
// or flag marker holds the figure right before it (nothing but spaces
// between); a figures marker the other figures before it in its
// sentence (a table's row), back to the marker before it, or, on a line
// of its own, the block it opens; a figures-below marker every other figure
// from it to the end of its section.
func applyMarkers(doc string, figs []*located) {
	code := mask(doc, fence, codeSpan)
	var markers [][]int
	for _, m := range figureMarker.FindAllStringSubmatchIndex(doc, -1) {
		if code[m[0]] == '<' { // not a marker shown in code
			markers = append(markers, m)
		}
	}
	for _, pass := range []string{"const", "flag", "figures", "figures below"} {
		for _, m := range markers {
			h := holder{kind: doc[m[2]:m[3]], arg: doc[m[4]:m[5]]}
			if h.kind != pass {
				continue
			}
			switch h.kind {
			case "figures":
				start, end := figuresScope(doc, markers, m)
				holdIn(figs, start, end, h)
			case "figures below":
				h.kind = "figures"
				holdIn(figs, m[0], sectionEnd(doc, m[0]), h)
			default:
				holdBefore(doc, figs, m[0], h)
			}
		}
	}
}

// figuresScope is what a figures marker holds: on a line of its own,
// the block it opens; else its block (a table's row) up to the marker,
// from the end of the marker before it in the block.
func figuresScope(doc string, markers [][]int, m []int) (int, int) {
	start, end := blockAround(doc, m[0])
	lineStart := strings.LastIndex(doc[:m[0]], "\n") + 1
	lineEnd := strings.IndexByte(doc[m[1]:], '\n')
	if lineEnd < 0 {
		lineEnd = len(doc) - m[1]
	}
	if strings.TrimSpace(doc[lineStart:m[0]]+doc[m[1]:m[1]+lineEnd]) == "" {
		return m[1], end
	}
	for _, o := range markers {
		if o[1] <= m[0] && o[1] > start {
			start = o[1]
		}
	}
	if ends := sentenceEnd.FindAllStringIndex(doc[start:m[0]], -1); len(ends) > 0 {
		start += ends[len(ends)-1][1]
	}
	return start, m[0]
}

// holdBefore gives h to the figure that ends right before offset at,
// nothing but spaces between.
func holdBefore(doc string, figs []*located, at int, h holder) {
	for _, f := range figs {
		if f.end <= at && strings.TrimSpace(doc[f.end:at]) == "" {
			f.held = h
		}
	}
}

// blockAround is the block around offset at: lines up to a blank line
// (a paragraph, a list), or, in a table, the row.
func blockAround(doc string, at int) (int, int) {
	lineStart := strings.LastIndex(doc[:at], "\n") + 1
	if strings.HasPrefix(doc[lineStart:], "|") {
		lineEnd := strings.Index(doc[at:], "\n")
		if lineEnd < 0 {
			return lineStart, len(doc)
		}
		return lineStart, at + lineEnd
	}
	start := strings.LastIndex(doc[:at], "\n\n")
	if start < 0 {
		start = 0
	}
	end := strings.Index(doc[at:], "\n\n")
	if end < 0 {
		return start, len(doc)
	}
	return start, at + end
}

// sectionEnd is where the section holding offset at ends: at the next
// heading of its level or above, or the doc's end.
func sectionEnd(doc string, at int) int {
	level := 7
	for _, h := range heading.FindAllStringSubmatchIndex(doc[:at], -1) {
		level = h[3] - h[2]
	}
	for _, h := range heading.FindAllStringSubmatchIndex(doc[at:], -1) {
		if h[3]-h[2] <= level && !inFence(doc, at+h[0]) {
			return at + h[0]
		}
	}
	return len(doc)
}

// inFence says whether offset at is inside a fenced block.
func inFence(doc string, at int) bool {
	for _, m := range fence.FindAllStringIndex(doc, -1) {
		if at >= m[0] && at < m[1] {
			return true
		}
	}
	return false
}
