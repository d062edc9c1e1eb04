package policy

import (
	"slices"
	"strings"
)

// ListEntries returns the entries of the allow and deny lists, each as
// "kind:value" (such as "client:vip" or "ip:10.0.0.0/8"), sorted. A single
// IP address shows as its host prefix, such as "ip:192.0.2.1/32".
func (p *Policy) ListEntries() (allow, deny []string) {
	return p.allow.entries(), p.deny.entries()
}

func (s *identitySet) entries() []string {
	var out []string
	for d, m := range s.byKind {
		for v := range m {
			out = append(out, Dimension(d).String()+":"+v)
		}
	}
	for _, pfx := range s.prefixes {
		out = append(out, "ip:"+pfx.String())
	}
	slices.SortFunc(out, strings.Compare)
	return slices.Compact(out)
}
