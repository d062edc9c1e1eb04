// Package jsonpath names the value of a JSON document at fault in a
// decoding error by its path, such as "checks[2].user", for the error
// bodies of the HTTP APIs.
package jsonpath

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
)

// FieldAt returns the path of the value of JSON document data that holds
// the byte at offset bad, such as "resource" or "checks[2].user"; a byte
// in an object key names the object, and one outside any value "body". It
// runs only on the error path.
func FieldAt(data []byte, bad int) string {
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
