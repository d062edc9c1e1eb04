// Naming the field at fault in an error decoding JSON, by its path.

package httpapi

import (
	"encoding/json"
	"errors"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/sluicehq/sluice/internal/jsonpath"
)

// jsonFieldErr turns an encoding/json error decoding data into a
// *engine.FieldError. A value of the wrong type is named by its path in
// data, with the index of a batch's check (encoding/json names
// "checks.cost" for "checks[2].cost").
func jsonFieldErr(data []byte, err error, bits func([]byte) uint16) error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		field := te.Field
		if te.Offset > 0 && te.Offset <= int64(len(data)) {
			// te.Offset is just past the value, or past the opening
			// brace or bracket of an object or array.
			field = jsonpath.FieldAt(data, int(te.Offset)-1)
		}
		if field == "" {
			field = "body"
		}
		return fieldErr(field, "want a JSON %s, got %s", jsonKind(te.Type.Kind().String()), te.Value)
	case errors.As(err, &se):
		return fieldErr("body", "malformed JSON at byte %d: %v", se.Offset, se)
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return fieldErr("body", "malformed JSON: unexpected end of input")
	}
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		if json.Valid(data) {
			// Named with its path, such as "checks[1].usr".
			if err := checkKeys(data, bits); err != nil {
				return err
			}
		}
		return fieldErr(strings.Trim(name, `"`), "unknown field")
	}
	return fieldErr("body", "malformed JSON: %s", strings.TrimPrefix(msg, "json: "))
}

func jsonKind(k string) string {
	switch k {
	case "int64", "int", "uint64":
		return "integer"
	case "ptr":
		return "integer"
	case "slice":
		return "array"
	case "struct":
		return "object"
	}
	return k
}

// fieldAtInvalidUTF8 returns the path of the value that holds the first
// invalid UTF-8 byte of data (see fieldAt).
func fieldAtInvalidUTF8(data []byte) string {
	bad := 0
	for bad < len(data) {
		r, size := utf8.DecodeRune(data[bad:])
		if r == utf8.RuneError && size <= 1 {
			break
		}
		bad += size
	}
	return jsonpath.FieldAt(data, bad)
}
