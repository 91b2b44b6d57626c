package store

import (
	"strings"
	"unicode/utf8"
)

// MaxErrorBytes caps the text of one recorded attempt error (panic stacks
// included).
const MaxErrorBytes = 8 << 10

// ErrorText is the text stored for err (a job's last_error and errors
// entry): its text, capped at MaxErrorBytes on a UTF-8 boundary, without
// NUL bytes, valid UTF-8.
func ErrorText(err error) *string {
	s := err.Error()
	if len(s) > MaxErrorBytes {
		cut := MaxErrorBytes
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "… (truncated)"
	}
	s = strings.ToValidUTF8(stripNUL(s), "\uFFFD")
	return &s
}

// stripNUL removes NUL bytes, which PostgreSQL text cannot hold.
func stripNUL(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			b := []byte(s)
			out := b[:0]
			for _, c := range b {
				if c != 0 {
					out = append(out, c)
				}
			}
			return string(out)
		}
	}
	return s
}
