package policy

import (
	"path"
	"strings"
)

// matcher finds the rules whose resource patterns match a resource. It is a
// trie on the resource's path segments: exact patterns sit at the node of
// their last segment, prefix patterns ("/api/*") at the node of the
// segments before the "*", and glob patterns at the node of their leading
// literal segments, where path.Match tests them. A lookup visits one node
// per segment of the resource, whatever the number of rules.
type matcher struct {
	root *trieNode
	// any holds the rules without a resource condition (or "*").
	any []*Rule
}

type trieNode struct {
	children map[string]*trieNode
	exact    []*Rule
	prefix   []*Rule
	globs    []globRule
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
	if !isGlob(p) {
		n := m.node(p)
		n.exact = append(n.exact, r)
		return
	}
	// The glob's node is that of its literal leading segments.
	lit := ""
	rest := p
	for {
		i := strings.IndexByte(rest, '/')
		if i < 0 || isGlob(rest[:i]) {
			break
		}
		if lit != "" {
			lit += "/"
		}
		lit += rest[:i]
		rest = rest[i+1:]
	}
	n := m.root
	if lit != "" {
		n = m.node(lit)
	}
	n.globs = append(n.globs, globRule{pattern: p, rule: r})
}

// node returns the node of the segments of p, creating it.
func (m *matcher) node(p string) *trieNode {
	n := m.root
	for _, seg := range strings.Split(p, "/") {
		c := n.children[seg]
		if c == nil {
			if n.children == nil {
				n.children = map[string]*trieNode{}
			}
			c = &trieNode{}
			n.children[seg] = c
		}
		n = c
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
	n := m.root
	rest := res
	done := false
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
			break
		}
		for _, rule := range n.prefix {
			dst = appendIf(dst, rule, r)
		}
		var seg string
		if i := strings.IndexByte(rest, '/'); i < 0 {
			seg, rest, done = rest, "", true
		} else {
			seg, rest = rest[:i], rest[i+1:]
		}
		c := n.children[seg]
		if c == nil {
			break
		}
		n = c
	}
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
