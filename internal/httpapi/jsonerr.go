// Naming the field at fault in an error decoding JSON, by its path.

package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"
)

// jsonFieldErr turns an encoding/json error decoding data into a
// *engine.FieldError. A value of the wrong type is named by its path in
// data, with the index of a batch's check (encoding/json names
// "checks.cost" for "checks[2].cost").
func jsonFieldErr(data []byte, err error) error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		field := te.Field
		if te.Offset > 0 && te.Offset <= int64(len(data)) {
			// te.Offset is just past the value, or past the opening
			// brace or bracket of an object or array.
			field = fieldAt(data, int(te.Offset)-1)
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
			if err := checkKeys(data); err != nil {
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
	return fieldAt(data, bad)
}

// fieldAt returns the path of the value of JSON document data that holds
// the byte at offset bad, such as "resource" or "checks[2].user"; a byte
// in an object key names the object, and one outside any value "body". It
// runs only on the error path.
func fieldAt(data []byte, bad int) string {
	// frame is one open object (its current key) or array (the index of
	// its current element).
	type frame struct {
		obj, wantKey bool
		key          string
		index        int
	}
	var stack []frame
	path := func(stack []frame) string {
		var b strings.Builder
		for _, f := range stack {
			if f.obj {
				if b.Len() > 0 {
					b.WriteByte('.')
				}
				b.WriteString(f.key)
			} else {
				b.WriteString("[" + strconv.Itoa(f.index) + "]")
			}
		}
		if b.Len() == 0 {
			return "body"
		}
		return b.String()
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	for {
		tok, err := dec.Token()
		if err != nil {
			return "body"
		}
		n := len(stack)
		// Where a key is due, the token is the key or the object's '}'.
		key, isKey := tok.(string)
		isKey = isKey && n > 0 && stack[n-1].obj && stack[n-1].wantKey
		if dec.InputOffset() > int64(bad) {
			if isKey {
				return path(stack[:n-1])
			}
			return path(stack)
		}
		if isKey {
			stack[n-1].key, stack[n-1].wantKey = key, false
			continue
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, frame{obj: true, wantKey: true})
			continue
		case json.Delim('['):
			stack = append(stack, frame{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:n-1]
		}
		// A value is complete: move its container on.
		if n := len(stack); n > 0 {
			if stack[n-1].obj {
				stack[n-1].wantKey = true
			} else {
				stack[n-1].index++
			}
		}
	}
}
