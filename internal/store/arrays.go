package store

import "github.com/jackc/pgx/v5/pgtype"

// Array parameters of the statements that take a batch of jobs (the
// finish statements' hundreds of IDs, tokens and states), encoded
// without an allocation per element: pgx boxes every element of a plain
// slice into an interface (two allocations for a [16]byte), and a batch
// of 1,000 outcomes made thousands. Each Index hands out a pointer into
// the slice instead, which an interface holds as is.

// uuidArray is a uuid[] parameter.
type uuidArray [][16]byte

// Dimensions implements pgtype.ArrayGetter (nil: SQL NULL).
func (a uuidArray) Dimensions() []pgtype.ArrayDimension { return dims(len(a), a == nil) }

// Index implements pgtype.ArrayGetter.
func (a uuidArray) Index(i int) any { return (*uuidElem)(&a[i]) }

// IndexType implements pgtype.ArrayGetter.
func (a uuidArray) IndexType() any { return (*uuidElem)(nil) }

type uuidElem [16]byte

// UUIDValue implements pgtype.UUIDValuer.
func (u *uuidElem) UUIDValue() (pgtype.UUID, error) { return pgtype.UUID{Bytes: *u, Valid: true}, nil }

// textArray is a text[] parameter.
type textArray []string

// Dimensions implements pgtype.ArrayGetter (nil: SQL NULL).
func (a textArray) Dimensions() []pgtype.ArrayDimension { return dims(len(a), a == nil) }

// Index implements pgtype.ArrayGetter.
func (a textArray) Index(i int) any { return (*textElem)(&a[i]) }

// IndexType implements pgtype.ArrayGetter.
func (a textArray) IndexType() any { return (*textElem)(nil) }

type textElem string

// TextValue implements pgtype.TextValuer.
func (t *textElem) TextValue() (pgtype.Text, error) {
	return pgtype.Text{String: string(*t), Valid: true}, nil
}

func dims(n int, null bool) []pgtype.ArrayDimension {
	if null {
		return nil
	}
	return []pgtype.ArrayDimension{{Length: int32(n), LowerBound: 1}}
}

// internedText scans a text column whose rows repeat a few values (a
// job's state, the server's timeline) without allocating for a value the
// previous row had, or for a job state: pgx allocates a string a row (and
// two more for a *string). SQL NULL scans as "".
type internedText struct{ v string }

// ScanBytes implements pgtype.BytesScanner; b is valid only during the
// call.
func (t *internedText) ScanBytes(b []byte) error {
	switch {
	case string(b) == t.v:
	case b == nil:
		t.v = ""
	default:
		t.v = internState(b)
	}
	return nil
}

// jobStates are the states a finish reports (a job row's, and
// "discarded"), the commonest first.
var jobStates = []string{"completed", "available", "scheduled", "failed", "cancelled", "discarded", "running", "blocked"}

// internState returns the job state b names without allocating, or a new
// string of b when it is none.
func internState(b []byte) string {
	for _, s := range jobStates {
		if string(b) == s {
			return s
		}
	}
	return string(b)
}
