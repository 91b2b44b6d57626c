package main

import (
	"strings"
)

// splitSQL splits a PostgreSQL script into its statements, each with the
// comments before it and its terminating semicolon. It knows quoted
// strings ('…', E'…'), quoted identifiers, dollar-quoted bodies ($$…$$,
// $tag$…$tag$) and comments (--, nested /* */), so semicolons inside them
// do not end a statement. Text after the last semicolon (comments) is
// returned as a last element. Every element is trimmed of surrounding
// blank space; empty ones are dropped.
func splitSQL(s string) []string {
	var out []string
	start := 0
	emit := func(end int) {
		if st := strings.TrimSpace(s[start:end]); st != "" {
			out = append(out, st)
		}
		start = end
	}
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '-' && strings.HasPrefix(s[i:], "--"):
			if j := strings.IndexByte(s[i:], '\n'); j >= 0 {
				i += j + 1
			} else {
				i = len(s)
			}
		case c == '/' && strings.HasPrefix(s[i:], "/*"):
			depth := 0
			for i < len(s) {
				if strings.HasPrefix(s[i:], "/*") {
					depth++
					i += 2
				} else if strings.HasPrefix(s[i:], "*/") {
					depth--
					i += 2
					if depth == 0 {
						break
					}
				} else {
					i++
				}
			}
		case c == '\'':
			escapes := i > 0 && (s[i-1] == 'E' || s[i-1] == 'e') && (i < 2 || !identChar(s[i-2]))
			i++
			for i < len(s) {
				if escapes && s[i] == '\\' {
					i += 2
					continue
				}
				if s[i] == '\'' {
					if i+1 < len(s) && s[i+1] == '\'' {
						i += 2
						continue
					}
					break
				}
				i++
			}
			i++
		case c == '"':
			if j := strings.IndexByte(s[i+1:], '"'); j >= 0 {
				i += j + 2
			} else {
				i = len(s)
			}
		case c == '$' && (i == 0 || !identChar(s[i-1])):
			tag, ok := dollarTag(s[i:])
			if !ok {
				i++
				continue
			}
			if j := strings.Index(s[i+len(tag):], tag); j >= 0 {
				i += len(tag) + j + len(tag)
			} else {
				i = len(s)
			}
		case c == ';':
			i++
			emit(i)
		default:
			i++
		}
	}
	emit(len(s))
	return out
}

// dollarTag returns the dollar-quote opening s, if s starts with one:
// "$$" or "$tag$".
func dollarTag(s string) (string, bool) {
	for j := 1; j < len(s); j++ {
		switch c := s[j]; {
		case c == '$':
			return s[:j+1], true
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' && j > 1 || c >= 0x80:
		default:
			return "", false
		}
	}
	return "", false
}

func identChar(c byte) bool {
	return c == '_' || c == '$' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c >= 0x80
}

// gooseEndsStatement reports whether goose's parser ends a statement at
// this line: its last word before a "--" comment ends with a semicolon.
func gooseEndsStatement(line string) bool {
	prev := ""
	for _, w := range strings.Fields(line) {
		if strings.HasPrefix(w, "--") {
			break
		}
		prev = w
	}
	return strings.HasSuffix(prev, ";")
}

// gooseSection writes statements in goose's annotated format: a statement
// that goose would cut short (a dollar-quoted body, or a line ending in a
// semicolon before its end) goes between StatementBegin and StatementEnd.
func gooseSection(b *strings.Builder, sql string) {
	for _, st := range splitSQL(sql) {
		lines := strings.Split(st, "\n")
		wrap := strings.Contains(st, "$")
		for _, l := range lines[:len(lines)-1] {
			wrap = wrap || gooseEndsStatement(l)
		}
		if !strings.HasSuffix(st, ";") {
			// Comments after the last statement.
			b.WriteString(st + "\n\n")
			continue
		}
		if wrap {
			// The comments before the statement stay outside the block.
			lead := 0
			for lead < len(lines)-1 && (strings.HasPrefix(strings.TrimSpace(lines[lead]), "--") || strings.TrimSpace(lines[lead]) == "") {
				lead++
			}
			if lead > 0 {
				b.WriteString(strings.TrimSpace(strings.Join(lines[:lead], "\n")) + "\n")
			}
			b.WriteString("-- +goose StatementBegin\n" + strings.Join(lines[lead:], "\n") + "\n-- +goose StatementEnd\n\n")
		} else {
			b.WriteString(st + "\n\n")
		}
	}
}
