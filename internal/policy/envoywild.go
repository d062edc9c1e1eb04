package policy

import (
	"slices"
	"strings"
)

// envoyWildcard is a descriptor value holding '*', such as "foo*",
// "*.example.com" or "a*b*c": each '*' stands for any run of characters,
// the empty one included, as in envoyproxy/ratelimit.
type envoyWildcard struct {
	order   int      // its place among the wildcards of its key, in file order
	pattern string   // as written
	parts   []string // pattern split on '*'
	entry   *envoyEntry
}

// matches reports whether value matches w: it starts with the first
// literal part, ends with the last, and holds the others in order
// between them, without overlap.
func (w *envoyWildcard) matches(value string) bool {
	first, last := w.parts[0], w.parts[len(w.parts)-1]
	if len(value) < len(first)+len(last) || !strings.HasPrefix(value, first) || !strings.HasSuffix(value, last) {
		return false
	}
	rest := value[len(first) : len(value)-len(last)]
	for _, p := range w.parts[1 : len(w.parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}

// wildcardIndex finds the first wildcard, in file order, that matches a
// value without trying them all: each wildcard is filed under its literal
// prefix (the part before its first '*') or, when longer, its literal
// suffix (the part after its last '*'); a lookup tries the value's
// prefixes and suffixes of the lengths filed, one map lookup each. Only
// wildcards that both start and end with '*' ("*", "*mid*") are tried one
// by one. A lookup costs one map lookup per distinct prefix or suffix
// length, plus the wildcards filed under the value's own prefixes and
// suffixes.
type wildcardIndex struct {
	n          int
	prefixes   map[string][]*envoyWildcard // in file order within a list
	prefixLens []int                       // ascending
	suffixes   map[string][]*envoyWildcard
	suffixLens []int
	rest       []*envoyWildcard // neither prefix nor suffix; in file order
}

// add files the wildcard pattern of entry e, the next in file order.
func (ix *wildcardIndex) add(pattern string, e *envoyEntry) {
	w := &envoyWildcard{order: ix.n, pattern: pattern, parts: strings.Split(pattern, "*"), entry: e}
	ix.n++
	first, last := w.parts[0], w.parts[len(w.parts)-1]
	switch {
	case first == "" && last == "":
		ix.rest = append(ix.rest, w)
	case len(first) >= len(last):
		if ix.prefixes == nil {
			ix.prefixes = map[string][]*envoyWildcard{}
		}
		if _, ok := ix.prefixes[first]; !ok {
			ix.prefixLens = insertLen(ix.prefixLens, len(first))
		}
		ix.prefixes[first] = append(ix.prefixes[first], w)
	default:
		if ix.suffixes == nil {
			ix.suffixes = map[string][]*envoyWildcard{}
		}
		if _, ok := ix.suffixes[last]; !ok {
			ix.suffixLens = insertLen(ix.suffixLens, len(last))
		}
		ix.suffixes[last] = append(ix.suffixes[last], w)
	}
}

func insertLen(lens []int, n int) []int {
	i, found := slices.BinarySearch(lens, n)
	if found {
		return lens
	}
	return slices.Insert(lens, i, n)
}

// match returns the entry of the first wildcard in file order that
// matches value, or nil. It does not allocate.
func (ix *wildcardIndex) match(value string) *envoyEntry {
	var best *envoyWildcard
	better := func(list []*envoyWildcard) {
		for _, w := range list {
			if best != nil && w.order >= best.order {
				return // the list is in file order
			}
			if w.matches(value) {
				best = w
				return
			}
		}
	}
	for _, n := range ix.prefixLens {
		if n > len(value) {
			break
		}
		better(ix.prefixes[value[:n]])
	}
	for _, n := range ix.suffixLens {
		if n > len(value) {
			break
		}
		better(ix.suffixes[value[len(value)-n:]])
	}
	better(ix.rest)
	if best == nil {
		return nil
	}
	return best.entry
}
