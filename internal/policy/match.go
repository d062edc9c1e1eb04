package policy

import (
	"path"
	"slices"
	"strings"
)

// matcher finds the rules whose resource patterns match a resource. It is a
// trie on the resource's path segments, with an edge per literal segment
// and one "any segment" edge:
//
//   - exact patterns sit at the node of their last segment;
//   - prefix patterns ("/api/*") sit at the node of the segments before
//     the "*" and match every resource below it;
//   - glob patterns follow the literal edges for their literal segments
//     and the "any segment" edge for the others (each glob segment, such
//     as "*" or "v[12]", matches exactly one segment of a resource), and
//     sit at the node of their last segment, where path.Match tests the
//     whole pattern (a "*" segment needs no test: those are exact). The
//     rare glob whose syntax spans a "/" (an escaped "\\/", a class
//     holding "/") sits at the node of its leading segments instead, and
//     is tested on every resource below.
//
// A lookup visits one node per segment of the resource on each path of
// the trie the resource follows: one path when no pattern has a glob
// segment, and one more from every "any segment" edge it takes. It does
// not depend on the number of rules.
type matcher struct {
	root *trieNode
	// any holds the rules without a resource condition (or "*").
	any []*Rule
}

type trieNode struct {
	children map[string]*trieNode
	star     *trieNode  // the edge of any one segment
	exact    []*Rule    // patterns ending here
	prefix   []*Rule    // prefix patterns of the segments to here
	tail     []globRule // glob patterns ending here, for path.Match
	globs    []globRule // globs spanning "/", tested below here
}

type globRule struct {
	pattern string // without the leading "/"
	rule    *Rule
}

func isGlob(s string) bool { return strings.ContainsAny(s, "*?[\\") }

func newMatcher(rules []*Rule) *matcher {
	m := &matcher{root: &trieNode{}}
	for _, r := range rules {
		if len(r.Resources) == 0 {
			m.any = append(m.any, r)
			continue
		}
		for _, pat := range r.Resources {
			m.add(pat, r)
		}
	}
	return m
}

func (m *matcher) add(pat string, r *Rule) {
	p := strings.TrimPrefix(pat, "/")
	if p == "*" || p == "**" {
		m.any = append(m.any, r)
		return
	}
	// A pattern is read as a resource is (see resourcePath), its kind
	// decided as written: "/api/*/" is a glob of one segment under /api,
	// not the prefix "/api/*".
	if strings.HasSuffix(p, "/*") && !isGlob(p[:len(p)-2]) {
		base, _ := resourcePath(p[:len(p)-2], false)
		if base == "" { // "//*", "/./*": everything
			m.any = append(m.any, r)
			return
		}
		n := m.node(base)
		n.prefix = append(n.prefix, r)
		return
	}
	p, _ = resourcePath(p, false)
	// Follow the segments: literal ones on their edge, glob ones on the
	// "any segment" edge.
	n := m.root
	spans := strings.Contains(p, "\\/") || classSpansSlash(p)
	glob := false
	rest := p
	for {
		seg, tail, more := strings.Cut(rest, "/")
		switch {
		case !isGlob(seg):
			n = n.child(seg)
		case spans:
			n.globs = append(n.globs, globRule{pattern: p, rule: r})
			return
		default:
			glob = glob || seg != "*"
			if n.star == nil {
				n.star = &trieNode{}
			}
			n = n.star
		}
		if !more {
			break
		}
		rest = tail
	}
	if glob {
		n.tail = append(n.tail, globRule{pattern: p, rule: r})
	} else {
		n.exact = append(n.exact, r)
	}
}

// classSpansSlash reports whether a character class of the glob p holds a
// "/", so that one of its "/"-separated parts is not a whole segment.
func classSpansSlash(p string) bool {
	in := false
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == '\\':
			i++
		case c == '[' && !in:
			in = true
		case c == ']' && in:
			in = false
		case c == '/' && in:
			return true
		}
	}
	return false
}

// child returns n's child for the literal segment seg, creating it.
func (n *trieNode) child(seg string) *trieNode {
	c := n.children[seg]
	if c == nil {
		if n.children == nil {
			n.children = map[string]*trieNode{}
		}
		c = &trieNode{}
		n.children[seg] = c
	}
	return c
}

// node returns the node of the literal segments of p, creating it.
func (m *matcher) node(p string) *trieNode {
	n := m.root
	for _, seg := range strings.Split(p, "/") {
		n = n.child(seg)
	}
	return n
}

// Match appends to dst the rules that apply to r, in policy order, and
// returns the extended slice. A rule applies when one of its resource
// patterns matches r.Resource (or it has none), and its methods and
// operations, if any, include r's (case-insensitively), and its clients,
// if any, include r's client id (case-sensitively). Match does not
// allocate when dst has room.
func (p *Policy) Match(r *Request, dst []*Rule) []*Rule {
	if p.matcher == nil {
		return dst
	}
	start := len(dst)
	m := p.matcher
	for _, rule := range m.any {
		dst = appendIf(dst, rule, r)
	}
	res, slash := resourcePath(r.Resource, true)
	dst = m.root.collect(res, res, false, slash, r, dst)
	// Policy order, without duplicates (a rule with several patterns may
	// match more than once). The lists are short: insertion sort.
	out := dst[start:]
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j].Index < out[j-1].Index; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	w := 0
	for i, rule := range out {
		if i > 0 && rule == out[w-1] {
			continue
		}
		out[w] = rule
		w++
	}
	return dst[:start+w]
}

// collect appends the rules of n and of its descendants that match the
// resource res, of which rest is the part below n (done when n is the
// node of res's last segment). slash reports that the resource ended in
// "/": the prefix patterns of its last node match it ("/api/*" matches
// "/api/").
func (n *trieNode) collect(res, rest string, done, slash bool, r *Request, dst []*Rule) []*Rule {
	for {
		for i := range n.globs {
			if ok, _ := path.Match(n.globs[i].pattern, res); ok {
				dst = appendIf(dst, n.globs[i].rule, r)
			}
		}
		if done {
			if slash {
				for _, rule := range n.prefix {
					dst = appendIf(dst, rule, r)
				}
			}
			for _, rule := range n.exact {
				dst = appendIf(dst, rule, r)
			}
			for i := range n.tail {
				if ok, _ := path.Match(n.tail[i].pattern, res); ok {
					dst = appendIf(dst, n.tail[i].rule, r)
				}
			}
			return dst
		}
		for _, rule := range n.prefix {
			dst = appendIf(dst, rule, r)
		}
		seg, tail, more := strings.Cut(rest, "/")
		rest, done = tail, !more
		if n.star != nil {
			dst = n.star.collect(res, rest, done, slash, r, dst)
		}
		c := n.children[seg]
		if c == nil {
			return dst
		}
		n = c
	}
}

func appendIf(dst []*Rule, rule *Rule, r *Request) []*Rule {
	if len(rule.Methods) > 0 && !anyFold(rule.Methods, r.Method) {
		return dst
	}
	if len(rule.Operations) > 0 && !anyFold(rule.Operations, r.Operation) {
		return dst
	}
	if len(rule.Clients) > 0 && !slices.Contains(rule.Clients, r.ClientID) {
		return dst
	}
	return append(dst, rule)
}

func anyFold(list []string, s string) bool {
	for _, x := range list {
		if strings.EqualFold(x, s) {
			return true
		}
	}
	return false
}

// resourcePath returns resource s as rules match it and the endpoint
// dimension counts it, without its leading "/": read as a URL path, so that
// the spellings a web server takes for one path are one resource. A query
// string (from the first "?", when query is set) is dropped;
// percent-encoded unreserved characters (letters, digits, "-", ".", "_",
// "~") are decoded, and the hex digits of other escapes upper-cased (RFC
// 3986, 6.2.2); then "." and ".." segments are resolved, runs of "/"
// merged and a trailing "/" dropped: "/api//v1/./x/../%6Frders/?a=1" is
// "api/v1/orders". slash reports that the path ended in "/" (or in a "."
// or ".." segment), for the prefix patterns of its last segment. Case is
// kept: "/API" is not "/api".
//
// A path that needs none of this, the usual one, is returned as it is,
// without allocating.
func resourcePath(s string, query bool) (p string, slash bool) {
	if query {
		if i := strings.IndexByte(s, '?'); i >= 0 {
			s = s[:i]
		}
	}
	t := strings.TrimPrefix(s, "/")
	if isCleanPath(t) {
		return t, false
	}
	if strings.IndexByte(t, '%') >= 0 {
		t = normalizeEscapes(t)
	}
	last := t[strings.LastIndexByte(t, '/')+1:]
	c := path.Clean("/" + t)[1:]
	return c, c != "" && (last == "" || last == "." || last == "..")
}

// isCleanPath reports whether t (without its leading "/") is its own
// resourcePath: no escape, no empty, "." or ".." segment, unless t is "".
func isCleanPath(t string) bool {
	if t == "" {
		return true
	}
	start := 0
	for i := 0; i <= len(t); i++ {
		if i < len(t) {
			switch t[i] {
			case '%':
				return false
			case '/':
			default:
				continue
			}
		}
		switch t[start:i] {
		case "", ".", "..":
			return false
		}
		start = i + 1
	}
	return true
}

// normalizeEscapes decodes the percent-encoded unreserved characters of s
// and upper-cases the hex digits of its other escapes.
func normalizeEscapes(s string) string {
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '%' || i+2 >= len(s) {
			b = append(b, c)
			continue
		}
		hi, lo := unhex(s[i+1]), unhex(s[i+2])
		if hi < 0 || lo < 0 {
			b = append(b, c)
			continue
		}
		v := byte(hi<<4 | lo)
		if v >= 'a' && v <= 'z' || v >= 'A' && v <= 'Z' || v >= '0' && v <= '9' || v == '-' || v == '.' || v == '_' || v == '~' {
			b = append(b, v)
		} else {
			b = append(b, '%', hexDigits[hi], hexDigits[lo])
		}
		i += 2
	}
	return string(b)
}

const hexDigits = "0123456789ABCDEF"

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}
