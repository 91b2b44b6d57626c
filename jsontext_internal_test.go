package backlog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog/internal/testdb"
)

// TestJSONNumbersAsPostgreSQLDecides feeds numbers around the limits of
// jsonb's numeric (digits before and after the point, exponents, zeros)
// to validateStoredJSON and to PostgreSQL, and requires the same verdict:
// what PostgreSQL refuses is an *InputError naming the field, what it
// stores is accepted.
func TestJSONNumbersAsPostgreSQLDecides(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ctx := context.Background()
	digits := func(first string, n int, fill string) string {
		if n <= 0 {
			return ""
		}
		return first + strings.Repeat(fill, n-1)
	}
	num := func(neg bool, intPart, frac string, exp string) string {
		s := intPart
		if neg {
			s = "-" + s
		}
		if frac != "" {
			s += "." + frac
		}
		if exp != "" {
			s += "e" + exp
		}
		return s
	}
	nums := []string{
		"0", "-0", "1", "1.5", "-3e2", "1E+2", "1e-2", "0.0", "12345678901234567890",
		"1e1000", "1e1001", "1e-1001", "1e131071", "1e131072", "12e131071", "1.5e131071",
		"0.1e131072", "0.1e131073", "1e-16383", "1e-16384", "0e131072", "0e200000", "0e-16383", "0e-16384",
		"1e200000", "-1e200000", "1e-200000", "1.0e-16382", "1.00e-16382", "10e-16384", "-0.0e-16383",
		"1e1073741822", "0e1073741822", "0e1073741823", "0e-1073741822", "0e-1073741823", "1e2147483648",
		"1e99999999999999999999", "1e00000000000000000001", "1e000016384", "1e-000016383",
		digits("1", 131072, "0"), digits("1", 131073, "0"), digits("9", 131072, "9") + ".5",
		"0." + strings.Repeat("1", 16383), "0." + strings.Repeat("1", 16384), "0." + strings.Repeat("0", 16384),
		"1." + strings.Repeat("1", 16384) + "e1", "1." + strings.Repeat("1", 16385) + "e1",
		"0." + strings.Repeat("0", 20000) + "1e20000", "0." + strings.Repeat("0", 20000) + "1e19990",
		digits("1", 130072, "0") + "e1000", digits("1", 130073, "0") + "e1000",
	}
	rng := rand.New(rand.NewPCG(1, 2))
	near := func(v int) int { return v + rng.IntN(5) - 2 }
	for range 300 {
		var intLen, fracLen, exp int
		switch rng.IntN(4) {
		case 0:
			intLen = near(131072)
		case 1:
			intLen, fracLen = 1+rng.IntN(30), near(16383)
		default:
			intLen, fracLen = 1+rng.IntN(2000), rng.IntN(2000)
		}
		expStr := ""
		switch rng.IntN(5) {
		case 0:
		case 1:
			exp = near(131072 - intLen)
		case 2:
			exp = near(fracLen - 16383)
		case 3:
			exp = near(1<<30 - 1)
			if rng.IntN(2) == 0 {
				exp = -exp
			}
		default:
			exp = rng.IntN(200001) - 100000
		}
		if expStr == "" && exp != 0 {
			expStr = fmt.Sprint(exp)
		}
		intPart := "0"
		if rng.IntN(4) > 0 {
			intPart = digits(fmt.Sprint(1+rng.IntN(9)), max(intLen, 1), fmt.Sprint(rng.IntN(10)))
		}
		frac := ""
		if fracLen > 0 {
			frac = strings.Repeat("0", rng.IntN(fracLen+1)) // leading zeros after the point
			frac = (frac + digits("7", fracLen, "3"))[:fracLen]
		}
		nums = append(nums, num(rng.IntN(2) == 0, intPart, frac, expStr))
	}
	refused := 0
	for _, n := range nums {
		for _, doc := range []string{n, `{"a":[true,"1e99999 \" 1e99999",` + n + `]}`} {
			require.True(t, json.Valid([]byte(doc)), "test case %.60s", doc)
			var stored bool
			pgErr := pool.QueryRow(ctx, `SELECT $1::text::jsonb IS NOT NULL`, doc).Scan(&stored)
			err := validateStoredJSON("args", []byte(doc))
			short := doc
			if len(short) > 80 {
				short = short[:40] + "…" + short[len(short)-30:]
			}
			if pgErr != nil {
				require.ErrorContains(t, pgErr, "value overflows numeric format", short)
				var ie *InputError
				require.True(t, errors.As(err, &ie), "PostgreSQL refuses %s (%d bytes), validation accepts it", short, len(doc))
				require.Equal(t, "args", ie.Field)
				refused++
			} else {
				require.NoError(t, err, "PostgreSQL stores %s (%d bytes)", short, len(doc))
			}
		}
	}
	t.Logf("%d documents, %d refused", 2*len(nums), refused)
	require.Greater(t, refused, len(nums)/4)
	require.Less(t, refused, 2*len(nums)*3/4)

	// Documents of random pieces (escapes PostgreSQL refuses or takes,
	// text that looks like numbers, numbers), at every alignment of the
	// eight-byte scan: the same verdict.
	pieces := []string{`"\u0000"`, `"\ud800"`, `"a\udc00"`, `"\ud83d\ude00"`, `"\\u0000"`, `"x\"1e99999"`, `"\\"`,
		`"3e12345"`, `"ée"`, `1e99999`, `1e9999`, `-12.5e-3`, `0e99999`, `true`, `null`, `"plain text"`, `7`}
	for range 2000 {
		var doc strings.Builder
		doc.WriteString(`[` + strings.Repeat(" ", rng.IntN(8)))
		for k := range 1 + rng.IntN(6) {
			if k > 0 {
				doc.WriteString(",")
			}
			doc.WriteString(pieces[rng.IntN(len(pieces))])
		}
		doc.WriteString(`]`)
		var stored bool
		pgErr := pool.QueryRow(ctx, `SELECT $1::text::jsonb IS NOT NULL`, doc.String()).Scan(&stored)
		err := validateStoredJSON("args", []byte(doc.String()))
		if pgErr != nil {
			var pe *pgconn.PgError
			require.ErrorAs(t, pgErr, &pe)
			require.Contains(t, []string{"22P02", "22P05", "22003"}, pe.Code, "%s: %v", doc.String(), pgErr)
			var ie *InputError
			require.True(t, errors.As(err, &ie), "PostgreSQL refuses %s (%v), validation accepts it", doc.String(), pgErr)
		} else {
			require.NoError(t, err, "PostgreSQL stores %s", doc.String())
		}
	}
}

// benchArgs is a typical job's args: a few strings, numbers, a list.
type benchArgs struct {
	To       string   `json:"to"`
	Subject  string   `json:"subject"`
	UserID   int64    `json:"user_id"`
	Amount   float64  `json:"amount"`
	Template string   `json:"template"`
	Locale   string   `json:"locale"`
	Tags     []string `json:"tags"`
	Retries  int      `json:"retries"`
}

var benchValue = benchArgs{To: "someone@example.com", Subject: "Your invoice 2026-11 is ready", UserID: 1234567,
	Amount: 1249.5, Template: "invoice-ready", Locale: "en-GB", Tags: []string{"billing", "monthly"}, Retries: 3}

// BenchmarkEncodeArgs measures the validation every enqueue runs on its
// args: a struct marshalled, the same as raw JSON, and 4 KiB of raw JSON
// dense with numbers.
func BenchmarkEncodeArgs(b *testing.B) {
	raw, _ := json.Marshal(benchValue)
	var nums strings.Builder
	nums.WriteString(`{"points":[`)
	for i := 0; nums.Len() < 4096; i++ {
		if i > 0 {
			nums.WriteByte(',')
		}
		nums.WriteString(`{"x":12.5,"y":-3e2,"id":1234567}`)
	}
	nums.WriteString(`]}`)
	dense := json.RawMessage(nums.String())
	for _, c := range []struct {
		name string
		v    any
	}{{"struct", benchValue}, {"raw", json.RawMessage(raw)}, {"numbers4KiB", dense}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := encodeArgs(c.v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkValidateStoredJSON isolates the check that the JSON text can be
// stored (after json.Valid or json.Marshal).
func BenchmarkValidateStoredJSON(b *testing.B) {
	raw, _ := json.Marshal(benchValue)
	b.SetBytes(int64(len(raw)))
	for b.Loop() {
		if err := validateStoredJSON("args", raw); err != nil {
			b.Fatal(err)
		}
	}
}
