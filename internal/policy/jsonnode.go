// A JSON object read straight into the yaml.Node tree that the rules
// decoder walks: the control plane writes its rules as JSON, and yaml.v3's
// parser took three quarters of the time to apply 10,000 of them.

package policy

import (
	"encoding/json"
	"strings"

	"go.yaml.in/yaml/v3"
)

// jsonNode returns the node tree yaml.v3 would make of data, when data is
// a JSON object that yaml.v3 reads as JSON reads it: printable ASCII and
// line breaks, without escapes, and not deeper than maxJSONDepth.
// Otherwise it returns false, and the spec goes through yaml.v3 (which
// reads YAML too). The nodes come from *slab (nil: a slab of their own),
// reused from its start: the caller must not keep the previous tree's.
func jsonNode(data []byte, slab *[]yaml.Node) (*yaml.Node, bool) {
	for _, c := range data {
		// Escapes, and characters other than printable ASCII and line
		// breaks, are where YAML and JSON part (YAML refuses DEL and
		// tabs in places, folds U+2028, and reads surrogate pairs
		// otherwise): leave them to yaml.v3.
		if (c < 0x20 || c > 0x7e || c == '\\') && c != '\n' && c != '\r' {
			return nil, false
		}
	}
	if !json.Valid(data) {
		return nil, false
	}
	if slab == nil {
		slab = new([]yaml.Node)
	}
	r := jsonReader{s: string(data), slab: slab}
	r.space()
	if r.i >= len(r.s) || r.s[r.i] != '{' {
		return nil, false
	}
	n, ok := r.value(0)
	if !ok {
		return nil, false
	}
	return &yaml.Node{Kind: yaml.DocumentNode, Line: 1, Column: 1, Content: []*yaml.Node{n}}, true
}

// maxJSONDepth bounds the nesting jsonNode reads; a rule is three deep.
const maxJSONDepth = 16

// jsonReader reads a valid JSON text without escapes or non-ASCII bytes.
type jsonReader struct {
	s    string
	i    int
	line int // of position i, less one
	bol  int // the position where that line begins
	// slab holds nodes allocated together, handed out one by one; used
	// of them are.
	slab *[]yaml.Node
	used int
}

func (r *jsonReader) space() {
	for r.i < len(r.s) && strings.IndexByte(" \r\n", r.s[r.i]) >= 0 {
		if r.s[r.i] == '\n' {
			r.line, r.bol = r.line+1, r.i+1
		}
		r.i++
	}
}

// node returns a node at the reader's position, as yaml.v3 places them
// (1-based; a JSON spec is usually one line).
func (r *jsonReader) node(kind yaml.Kind, tag, value string, style yaml.Style) *yaml.Node {
	if r.used == len(*r.slab) {
		// The nodes handed out stay in the former slab.
		*r.slab, r.used = make([]yaml.Node, max(64, len(r.s)/8, 2*len(*r.slab))), 0
	}
	n := &(*r.slab)[r.used]
	r.used++
	*n = yaml.Node{Kind: kind, Tag: tag, Value: value, Style: style, Line: r.line + 1, Column: r.i - r.bol + 1}
	return n
}

// value reads the value at the reader's position.
func (r *jsonReader) value(depth int) (*yaml.Node, bool) {
	if depth > maxJSONDepth {
		return nil, false
	}
	switch c := r.s[r.i]; {
	case c == '{':
		n := r.node(yaml.MappingNode, "!!map", "", yaml.FlowStyle)
		r.i++
		r.space()
		if r.s[r.i] == '}' {
			r.i++
			return n, true
		}
		for {
			r.space()
			k := r.str()
			r.space()
			r.i++ // ':'
			r.space()
			v, ok := r.value(depth + 1)
			if !ok {
				return nil, false
			}
			n.Content = append(n.Content, k, v)
			r.space()
			c := r.s[r.i]
			r.i++
			if c == '}' {
				return n, true
			}
		}
	case c == '[':
		n := r.node(yaml.SequenceNode, "!!seq", "", yaml.FlowStyle)
		r.i++
		r.space()
		if r.s[r.i] == ']' {
			r.i++
			return n, true
		}
		for {
			r.space()
			v, ok := r.value(depth + 1)
			if !ok {
				return nil, false
			}
			n.Content = append(n.Content, v)
			r.space()
			c := r.s[r.i]
			r.i++
			if c == ']' {
				return n, true
			}
		}
	case c == '"':
		return r.str(), true
	default:
		start := r.i
		for r.i < len(r.s) && strings.IndexByte(",}] \t\r\n", r.s[r.i]) < 0 {
			r.i++
		}
		lit := r.s[start:r.i]
		at := r.i
		r.i = start
		var n *yaml.Node
		switch {
		case lit == "true" || lit == "false":
			n = r.node(yaml.ScalarNode, "!!bool", lit, 0)
		case lit == "null":
			n = r.node(yaml.ScalarNode, "!!null", lit, 0)
		case strings.ContainsAny(lit, ".eE"):
			n = r.node(yaml.ScalarNode, "!!float", lit, 0)
		default:
			n = r.node(yaml.ScalarNode, "!!int", lit, 0)
		}
		r.i = at
		return n, true
	}
}

// str reads a string, which has no escapes.
func (r *jsonReader) str() *yaml.Node {
	n := r.node(yaml.ScalarNode, "!!str", "", yaml.DoubleQuotedStyle)
	end := strings.IndexByte(r.s[r.i+1:], '"')
	n.Value = r.s[r.i+1 : r.i+1+end]
	r.i += end + 2
	return n
}
