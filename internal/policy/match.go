package policy

import (
	"path"
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
	if strings.HasSuffix(p, "/*") && !isGlob(p[:len(p)-2]) {
		n := m.node(p[:len(p)-2])
		n.prefix = append(n.prefix, r)
		return
	}
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
// operations, if any, include r's (case-insensitively). Match does not
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
	res := strings.TrimPrefix(r.Resource, "/")
	dst = m.root.collect(res, res, false, r, dst)
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
// node of res's last segment).
func (n *trieNode) collect(res, rest string, done bool, r *Request, dst []*Rule) []*Rule {
	for {
		for i := range n.globs {
			if ok, _ := path.Match(n.globs[i].pattern, res); ok {
				dst = appendIf(dst, n.globs[i].rule, r)
			}
		}
		if done {
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
			dst = n.star.collect(res, rest, done, r, dst)
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
