package backlog

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"unicode/utf8"
)

// JSON text PostgreSQL can store as jsonb. encoding/json accepts some
// that jsonb refuses: escapes of characters it cannot hold, and numbers
// beyond numeric's range. Args, results and progress are checked here, so
// such a value is an *InputError at the call rather than a failed write.

// validateStoredJSON checks that valid JSON text (json.Valid) can be stored
// as jsonb: valid UTF-8, no \u0000 escape (jsonb cannot hold a NUL
// character), no unpaired UTF-16 surrogate escape (which PostgreSQL
// rejects), and every number within what jsonb's numeric holds
// (checkNumber).
//
// It runs on every enqueue, so it is one pass, eight bytes at a time,
// that stops only at backslashes (in valid JSON, always inside a string)
// and at an e or E after a digit (an exponent, or text such as a hex
// string): a number can only be out of range with an exponent of five
// digits or more, or with a run of thousands of digits (numberSuspect).
// Only then is the text walked token by token (checkNumbers); typical
// args never are. BenchmarkValidateStoredJSON measures it.
func validateStoredJSON(field string, b []byte) error {
	if !utf8.Valid(b) {
		return invalid(field, "not valid UTF-8")
	}
	suspect := longDigitRun(b)
	for i := 0; i < len(b); i++ {
		if i = toBackslash(b, i, &suspect); i >= len(b) {
			break
		}
		i++ // the escaped character
		if i >= len(b) || b[i] != 'u' {
			continue
		}
		r, ok := hex4(b, i+1)
		if !ok {
			continue // json.Valid rejected this already
		}
		i += 4
		switch {
		case r == 0:
			return invalid(field, `contains a NUL character (\u0000), which PostgreSQL cannot store`)
		case r >= 0xDC00 && r <= 0xDFFF:
			return invalid(field, `contains an unpaired UTF-16 surrogate (\u%04x), which PostgreSQL rejects`, r)
		case r >= 0xD800 && r <= 0xDBFF:
			lo, ok := rune(0), false
			if i+2 < len(b) && b[i+1] == '\\' && b[i+2] == 'u' {
				lo, ok = hex4(b, i+3)
			}
			if !ok || lo < 0xDC00 || lo > 0xDFFF {
				return invalid(field, `contains an unpaired UTF-16 surrogate (\u%04x), which PostgreSQL rejects`, r)
			}
			i += 6
		}
	}
	if suspect {
		return checkNumbers(field, b)
	}
	return nil
}

// numberSuspect is the length of a digit run from which a number might be
// out of range. Below it, with an exponent of at most 4 digits (|e| <=
// 9999), a number has fewer than 6384 + 9999 = 16383 digits after the
// point and far fewer than 131072 before it: always in range.
const numberSuspect = 6384

// longExponent reports whether b[at:] starts with what may be an exponent
// of five digits or more: an optional sign, then five digits.
func longExponent(b []byte, at int) bool {
	if at < len(b) && (b[at] == '+' || b[at] == '-') {
		at++
	}
	if at+5 > len(b) {
		return false
	}
	for _, c := range b[at : at+5] {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// longDigitRun reports whether b has a run of numberSuspect digits. Such a
// run covers one of the positions numberSuspect/2 apart: only those are
// probed, and the run measured around a probe that finds a digit.
func longDigitRun(b []byte) bool {
	const step = numberSuspect / 2
	for k := step; k < len(b); k += step {
		if !isDigit(b[k]) {
			continue
		}
		lo, hi := k, k+1
		for lo > 0 && isDigit(b[lo-1]) {
			lo--
		}
		for hi < len(b) && isDigit(b[hi]) {
			hi++
		}
		if hi-lo >= numberSuspect {
			return true
		}
	}
	return false
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// Masks of bytes, eight at a time: each has the high bit of a byte set
// where the byte matches, and every other bit clear.
const (
	ones = 0x0101010101010101 // ones*c has c in every byte
	low7 = 0x7F7F7F7F7F7F7F7F
	high = 0x8080808080808080
)

// zeroBytes marks the zero bytes of x (no carries between bytes).
func zeroBytes(x uint64) uint64 { return ^((x&low7 + low7) | x | low7) }

// digitBytes marks the bytes of x that are ASCII digits.
func digitBytes(x uint64) uint64 {
	t := x & low7
	return (t + ones*(0x80-'0')) &^ (t + ones*(0x80-'9'-1)) &^ x & high
}

// toBackslash returns the index of the first backslash in b from at on
// (len(b) when there is none), eight bytes at a time, and sets *suspect
// when it passes an e or E after a digit (an exponent, or text like 3e in
// a string) that starts what may be an exponent of five digits or more.
func toBackslash(b []byte, at int, suspect *bool) int {
	var carry uint64 // marks byte 0 when the byte before the word is a digit
	if at > 0 && isDigit(b[at-1]) {
		carry = 0x80
	}
	n := at
	for ; n+8 <= len(b); n += 8 {
		x := binary.LittleEndian.Uint64(b[n:])
		digits := digitBytes(x)
		if after := digits<<8 | carry; after != 0 {
			for exp := after & zeroBytes((x|ones*0x20)^ones*'e'); exp != 0; exp &= exp - 1 {
				*suspect = *suspect || longExponent(b, n+bits.TrailingZeros64(exp)/8+1)
			}
		}
		if bs := zeroBytes(x ^ ones*'\\'); bs != 0 {
			return n + bits.TrailingZeros64(bs)/8
		}
		carry = digits >> 56
	}
	for ; n < len(b); n++ {
		switch c := b[n]; {
		case c == '\\':
			return n
		case c|0x20 == 'e' && n > 0 && isDigit(b[n-1]):
			*suspect = *suspect || longExponent(b, n+1)
		}
	}
	return n
}

// checkNumbers walks valid JSON text token by token and checks each
// number.
func checkNumbers(field string, b []byte) error {
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++ // skip the escaped character (an escaped quote among them)
				}
			}
		case c == '-' || isDigit(c):
			end, err := checkNumber(field, b, i)
			if err != nil {
				return err
			}
			i = end - 1
		}
	}
	return nil
}

// What jsonb's numbers (PostgreSQL's numeric) hold, as numeric_in decides
// it: at most 131072 digits before the decimal point (counted from the
// first significant digit, the exponent applied) and 16383 after it (its
// display scale: the digits written after the point minus the exponent,
// trailing zeros included, so 0.0e-16383 does not fit), and an exponent
// below 2^30 - 1 in magnitude whatever the value (1e200000 and
// 0e1073741823 do not fit; 0e200000 does). Measured on PostgreSQL 15:
// TestJSONNumbersAsPostgreSQLDecides holds these to the server's own
// verdict. (Since 2016 numeric_in bounds the exponent only against
// overflow and leaves the range to the storage format.)
const (
	numericMaxIntDigits  = 131072
	numericMaxFracDigits = 16383
	numericMaxExponent   = 1<<30 - 1 // INT_MAX / 2, refused from there
)

// checkNumber checks the JSON number starting at b[at] and returns the
// index just past it. A number without exponent is decided by the lengths
// of its digit runs (JSON allows no leading zeros); only an exponent is
// parsed.
func checkNumber(field string, b []byte, at int) (int, error) {
	i := at
	if b[i] == '-' {
		i++
	}
	intStart := i
	for i < len(b) && isDigit(b[i]) {
		i++
	}
	intDigits := b[intStart:i]
	var fracDigits []byte
	if i < len(b) && b[i] == '.' {
		i++
		fracStart := i
		for i < len(b) && isDigit(b[i]) {
			i++
		}
		fracDigits = b[fracStart:i]
	}
	if i == len(b) || b[i] != 'e' && b[i] != 'E' {
		if len(intDigits) <= numericMaxIntDigits && len(fracDigits) <= numericMaxFracDigits {
			return i, nil
		}
		return i, numberErr(field, b[at:i])
	}
	i++
	neg := false
	if i < len(b) && (b[i] == '+' || b[i] == '-') {
		neg = b[i] == '-'
		i++
	}
	exp := int64(0)
	for ; i < len(b) && isDigit(b[i]); i++ {
		if exp < numericMaxExponent {
			exp = exp*10 + int64(b[i]-'0')
		}
	}
	if neg {
		exp = -exp
	}
	if exp >= numericMaxExponent || exp <= -numericMaxExponent {
		return i, numberErr(field, b[at:i])
	}
	if int64(len(fracDigits))-exp > numericMaxFracDigits {
		return i, numberErr(field, b[at:i])
	}
	// The decimal exponent of the first significant digit (a zero has
	// none, and any exponent fits it).
	lead, zero := int64(len(intDigits)-1), true
	if len(intDigits) != 1 || intDigits[0] != '0' {
		zero = false
	} else {
		for k, d := range fracDigits {
			if d != '0' {
				lead, zero = -int64(k+1), false
				break
			}
		}
	}
	if !zero && lead+exp >= numericMaxIntDigits {
		return i, numberErr(field, b[at:i])
	}
	return i, nil
}

func numberErr(field string, num []byte) error {
	shown := string(num)
	if len(shown) > 40 {
		shown = shown[:20] + "…" + shown[len(shown)-12:] + fmt.Sprintf(" (%d characters)", len(num))
	}
	return invalid(field, "the number %s is out of the range PostgreSQL stores (jsonb numbers hold at most %d digits "+
		"before the decimal point and %d after it)", shown, numericMaxIntDigits, numericMaxFracDigits)
}

// hex4 decodes the four hex digits at b[at:].
func hex4(b []byte, at int) (rune, bool) {
	if at+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[at : at+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}
