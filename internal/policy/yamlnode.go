package policy

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// maxErrors bounds the problems reported for one file.
const maxErrors = 50

// maxWork bounds the mapping entries and list items a file may make the
// decoder visit. Aliases can make a small file stand for an exponentially
// large tree; the budget turns that into an error.
const maxWork = 2_000_000

// MaxDecodedBytes bounds the bytes of the names and values a file may
// make the decoder build and keep (an Envoy descriptor's full key holds
// its parents': nesting makes them grow with the square of the depth),
// and of the Envoy descriptors built (aliases expanded), beside the file
// itself. A file beyond it is rejected as too large.
const MaxDecodedBytes = 128 << 20

// maxErrorValue bounds the bytes of a value quoted in an error; a longer
// one is cut, and the error says how long it was.
const maxErrorValue = 128

// maxErrorMsg bounds the bytes of one error's message.
const maxErrorMsg = 1024

// decoder walks a yaml.Node tree and collects errors with positions.
type decoder struct {
	file  string
	errs  []error
	work  int
	bytes int // spent of MaxDecodedBytes; never more
	// bytesOut is set once the bytes budget is exhausted.
	bytesOut bool
	// shared, when set, holds the limits compiled so far by what they
	// were compiled from, for compile to return instead of compiling one
	// again (see sharedLimit).
	shared map[sharedLimit]*Limit
}

// spendBytes takes k bytes from the budget of names and values built,
// reporting false (once, with an error) when it is exhausted.
func (d *decoder) spendBytes(n *yaml.Node, k int) bool {
	if d.bytesOut {
		return false
	}
	if k > MaxDecodedBytes-d.bytes {
		d.bytesOut = true
		d.errorf(n, "the configuration is too large (its names and values take more than %d MiB once built)", MaxDecodedBytes>>20)
		return false
	}
	d.bytes += k
	return true
}

// clip returns s, or its start and its length when it is longer than
// maxErrorValue bytes, for errors.
func clip(s string) string { return clipTo(s, maxErrorValue) }

// clipTo returns s, or its first n bytes (whole UTF-8 characters) and its
// length when it is longer.
func clipTo(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return fmt.Sprintf("%s...(%d bytes)", s[:n], len(s))
}

// spend takes k from the work budget, reporting false (once, with an
// error) when it is exhausted.
func (d *decoder) spend(n *yaml.Node, k int) bool {
	if d.work > maxWork {
		return false
	}
	d.work += k
	if d.work > maxWork {
		d.errorf(n, "the configuration is too large (more than %d entries once aliases are expanded)", maxWork)
		return false
	}
	return true
}

func (d *decoder) errorf(n *yaml.Node, format string, args ...any) {
	if len(d.errs) >= maxErrors {
		return
	}
	for i, a := range args {
		// Arguments quoting a value clipped already are a little longer.
		if s, ok := a.(string); ok {
			args[i] = clipTo(s, 2*maxErrorValue)
		}
	}
	msg := fmt.Sprintf(format, args...)
	e := &ConfigError{File: d.file, Msg: clipTo(msg, maxErrorMsg)}
	if n != nil {
		e.Line, e.Column = n.Line, n.Column
	}
	d.errs = append(d.errs, e)
}

func (d *decoder) err() error {
	if len(d.errs) == 0 {
		return nil
	}
	return errors.Join(d.errs...)
}

// resolve follows aliases.
func resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < 100; i++ {
		n = n.Alias
	}
	return n
}

// field is one key/value pair of a mapping.
type field struct {
	key  string
	k, v *yaml.Node
}

// fields returns the pairs of mapping n, reporting non-mappings, duplicate
// keys and keys outside allowed (when allowed is not nil).
func (d *decoder) fields(n *yaml.Node, what string, allowed ...string) []field {
	n = resolve(n)
	if n == nil {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		d.errorf(n, "%s: want a mapping, got %s", what, kindName(n))
		return nil
	}
	if !d.spend(n, len(n.Content)/2+1) {
		return nil
	}
	out := make([]field, 0, len(n.Content)/2)
	seen := make(map[string]bool, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolve(n.Content[i]), resolve(n.Content[i+1])
		if k == nil || v == nil {
			continue
		}
		if k.Kind != yaml.ScalarNode {
			d.errorf(k, "%s: keys must be strings", what)
			continue
		}
		if k.Value == "<<" {
			d.errorf(k, "%s: merge keys (<<) are not supported", what)
			continue
		}
		if seen[k.Value] {
			d.errorf(k, "%s: duplicate key %q", what, k.Value)
			continue
		}
		seen[k.Value] = true
		if allowed != nil && !contains(allowed, k.Value) {
			d.errorf(k, "%s: unknown key %q (want one of %s)", what, k.Value, strings.Join(allowed, ", "))
			continue
		}
		out = append(out, field{key: k.Value, k: k, v: v})
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "null"
		}
		return fmt.Sprintf("%q", clip(n.Value))
	}
	return "something else"
}

func (d *decoder) scalar(n *yaml.Node, what string) (string, bool) {
	n = resolve(n)
	if n == nil || n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		if n != nil {
			d.errorf(n, "%s: want a value, got %s", what, kindName(n))
		}
		return "", false
	}
	return n.Value, true
}

func (d *decoder) str(n *yaml.Node, what string) (string, bool) {
	s, ok := d.scalar(n, what)
	if ok && n.Tag != "" && n.Tag != "!!str" && n.Tag != "!!int" && n.Tag != "!!float" && n.Tag != "!!bool" && n.Tag != "!!timestamp" {
		d.errorf(n, "%s: want a string", what)
		return "", false
	}
	return s, ok
}

func (d *decoder) int64(n *yaml.Node, what string) (int64, bool) {
	s, ok := d.scalar(n, what)
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseInt(strings.ReplaceAll(s, "_", ""), 10, 64)
	if err != nil {
		d.errorf(n, "%s: want an integer, got %q", what, s)
		return 0, false
	}
	return v, true
}

func (d *decoder) float(n *yaml.Node, what string) (float64, bool) {
	s, ok := d.scalar(n, what)
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		d.errorf(n, "%s: want a number, got %q", what, s)
		return 0, false
	}
	return v, true
}

func (d *decoder) bool(n *yaml.Node, what string) (bool, bool) {
	s, ok := d.scalar(n, what)
	if !ok {
		return false, false
	}
	switch s {
	case "true", "True", "TRUE":
		return true, true
	case "false", "False", "FALSE":
		return false, true
	}
	d.errorf(n, "%s: want true or false, got %q", what, s)
	return false, false
}

func (d *decoder) duration(n *yaml.Node, what string) (time.Duration, bool) {
	s, ok := d.scalar(n, what)
	if !ok {
		return 0, false
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		d.errorf(n, "%s: want a duration such as 1s, 1m or 24h, got %q", what, s)
		return 0, false
	}
	if v <= 0 {
		d.errorf(n, "%s: must be positive, got %s", what, s)
		return 0, false
	}
	return v, true
}

// strings decodes a string or a non-empty list of strings.
func (d *decoder) strings(n *yaml.Node, what string) []string {
	n = resolve(n)
	if n == nil {
		return nil
	}
	if n.Kind == yaml.ScalarNode {
		s, ok := d.str(n, what)
		if !ok {
			return nil
		}
		if s == "" {
			d.errorf(n, "%s: must not be empty", what)
			return nil
		}
		return []string{s}
	}
	if n.Kind != yaml.SequenceNode {
		d.errorf(n, "%s: want a string or a list of strings, got %s", what, kindName(n))
		return nil
	}
	if len(n.Content) == 0 {
		d.errorf(n, "%s: must not be an empty list (leave the key out to match everything)", what)
		return nil
	}
	if !d.spend(n, len(n.Content)+1) {
		return nil
	}
	out := make([]string, 0, len(n.Content))
	for _, c := range n.Content {
		s, ok := d.str(c, what)
		if !ok {
			continue
		}
		if s == "" {
			d.errorf(c, "%s: must not be empty", what)
			continue
		}
		out = append(out, s)
	}
	return out
}

func (d *decoder) seq(n *yaml.Node, what string) []*yaml.Node {
	n = resolve(n)
	if n == nil {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		d.errorf(n, "%s: want a list, got %s", what, kindName(n))
		return nil
	}
	if !d.spend(n, len(n.Content)+1) {
		return nil
	}
	return n.Content
}
