package policy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.yaml.in/yaml/v3"
)

// Limits of reading a configuration.
const (
	// MaxConfigBytes bounds the size of one configuration file, and of
	// all the files of a configuration directory together.
	MaxConfigBytes = 8 << 20
	// MaxConfigFiles bounds the files of a configuration directory.
	MaxConfigFiles = 1000
	// ReadTimeout bounds the reading of a configuration file.
	ReadTimeout = 5 * time.Second
)

// File is one configuration file as read: its path and contents.
type File struct {
	Name string
	Data []byte
}

// Options are the choices of loading a configuration. The zero value is
// envoyproxy/ratelimit's default.
type Options struct {
	// MergeDomains lets several files of a configuration directory hold
	// one Envoy domain: their descriptors are merged, as
	// envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG does; a descriptor that
	// two of them hold (same key and value at the same place) is still an
	// error. Without it, a domain held by two files is an error.
	MergeDomains bool
}

// Read reads the configuration at path: one file, or the files of a
// directory (see ReadDir). It opens only regular files, reads at most
// MaxConfigBytes and gives up after ReadTimeout, so that a device, a
// named pipe or a symlink to one is an error, not a hang.
func Read(path string) ([]File, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if fi.IsDir() {
		return ReadDir(path)
	}
	data, err := ReadFile(path, MaxConfigBytes)
	if err != nil {
		return nil, err
	}
	return []File{{Name: path, Data: data}}, nil
}

// ReadDir reads the files of the directory dir, in name order: every
// regular file whose name ends in .yaml or .yml and does not start with
// ".", not those of its subdirectories. Together they may hold at most
// MaxConfigBytes, in at most MaxConfigFiles files.
func ReadDir(dir string) ([]File, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	var out []File
	left := int64(MaxConfigBytes)
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !(strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")) {
			continue
		}
		full := filepath.Join(dir, name)
		if fi, err := os.Stat(full); err == nil && fi.IsDir() {
			continue
		}
		if len(out) == MaxConfigFiles {
			return nil, fmt.Errorf("%w: %s: more than %d configuration files", ErrInvalidConfig, dir, MaxConfigFiles)
		}
		data, err := ReadFile(full, left)
		if err != nil {
			return nil, err
		}
		left -= int64(len(data))
		out = append(out, File{Name: full, Data: data})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: %s: no configuration file (*.yaml, *.yml) in the directory", ErrInvalidConfig, dir)
	}
	return out, nil
}

// ReadFile reads the regular file at path, of at most max bytes, within
// ReadTimeout. Anything else (a directory, a device, a named pipe, or a
// symlink to one) is an error, as is a larger file or a slower read.
func ReadFile(path string, max int64) ([]byte, error) {
	fail := func(err error) ([]byte, error) {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return fail(err)
	}
	if !fi.Mode().IsRegular() {
		return fail(fmt.Errorf("%s: not a regular file (%s)", path, fi.Mode().Type()))
	}
	if fi.Size() > max {
		return fail(fmt.Errorf("%s: %d bytes, more than the %d a configuration may hold", path, fi.Size(), max))
	}
	// Opened without blocking, in case it was replaced by a named pipe
	// since: opening one waits for a writer.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return fail(err)
	}
	type result struct {
		data []byte
		err  error
	}
	done := make(chan result, 1)
	go func() {
		defer f.Close()
		fi, err := f.Stat()
		if err == nil && !fi.Mode().IsRegular() {
			err = fmt.Errorf("%s: not a regular file (%s)", path, fi.Mode().Type())
		}
		var data []byte
		if err == nil {
			data, err = io.ReadAll(io.LimitReader(f, max+1))
		}
		if err == nil && int64(len(data)) > max {
			err = fmt.Errorf("%s: more than the %d bytes a configuration may hold", path, max)
		}
		done <- result{data, err}
	}()
	t := time.NewTimer(ReadTimeout)
	defer t.Stop()
	select {
	case r := <-done:
		if r.err != nil {
			return fail(r.err)
		}
		return r.data, nil
	case <-t.C:
		// The read goroutine ends with the read, and closes the file.
		return fail(fmt.Errorf("%s: not read within %s", path, ReadTimeout))
	}
}

// Load reads and parses the configuration at path, a file or a directory
// (see Read and ParseFiles), with the default Options.
func Load(path string) (*Policy, error) { return LoadWith(path, Options{}) }

// LoadWith reads and parses the configuration at path, a file or a
// directory (see Read and ParseFiles), with opts.
func LoadWith(path string, opts Options) (*Policy, error) {
	files, err := Read(path)
	if err != nil {
		return nil, err
	}
	return ParseFiles(files, opts)
}

// ParseFiles parses a configuration read by Read. One file is parsed as
// Parse does. Several (a directory's) must each be an envoyproxy/ratelimit
// configuration, of its own domain unless opts.MergeDomains is set; the
// budgets of Parse hold for them together.
func ParseFiles(files []File, opts Options) (p *Policy, err error) {
	if len(files) == 1 {
		return Parse(files[0].Name, files[0].Data)
	}
	defer func() {
		if r := recover(); r != nil {
			p, err = nil, &ConfigError{File: files[0].Name, Msg: fmt.Sprintf("cannot parse: %v", r)}
		}
	}()
	return parseEnvoyFiles(files, opts)
}

// Snapshot returns bytes that are equal for two reads of a configuration
// exactly when they read the same files with the same contents.
func Snapshot(files []File) []byte {
	var b bytes.Buffer
	for _, f := range files {
		b.WriteString(strconv.Itoa(len(f.Name)) + ":" + f.Name + strconv.Itoa(len(f.Data)) + ":")
		b.Write(f.Data)
	}
	return b.Bytes()
}

// parseEnvoyFiles parses the Envoy configurations of a directory.
func parseEnvoyFiles(files []File, opts Options) (*Policy, error) {
	d := &decoder{}
	p := &Policy{Source: filepath.Dir(files[0].Name), Tiers: map[string]*Tier{}, envoy: map[string]*envoyDomain{}}
	from := map[string]string{} // domain to its first file
	sum := sha256.New()
	for _, f := range files {
		sum.Write(Snapshot([]File{f}))
		d.file = f.Name
		var doc yaml.Node
		more, err := unmarshal(f.Data, &doc)
		if err != nil {
			d.errs = append(d.errs, syntaxError(f.Name, err))
			continue
		}
		if more != nil {
			d.errorf(more, "a second YAML document: a file holds one domain")
			continue
		}
		root := resolve(&doc)
		if root != nil && root.Kind == yaml.DocumentNode && len(root.Content) > 0 {
			root = resolve(root.Content[0])
		}
		if root == nil || root.Kind != yaml.MappingNode || !slices.ContainsFunc(root.Content, func(n *yaml.Node) bool {
			return n.Kind == yaml.ScalarNode && n.Value == "domain"
		}) {
			d.errorf(root, "a file of a configuration directory must be an envoyproxy/ratelimit configuration (with `domain:`)")
			continue
		}
		name, descs := d.envoyHead(root)
		if name == "" {
			continue
		}
		dom := p.envoy[name]
		switch {
		case dom == nil:
			dom = &envoyDomain{name: name}
			p.envoy[name] = dom
			from[name] = f.Name
		case !opts.MergeDomains:
			d.errorf(root, "duplicate domain %q (also in %s; set the merge of domains to merge them)", name, from[name])
			continue
		}
		d.envoyInto(dom, descs)
		if len(d.errs) >= maxErrors {
			break
		}
	}
	if err := d.err(); err != nil {
		return nil, err
	}
	p.Version = hex.EncodeToString(sum.Sum(nil)[:6])
	p.matcher = newMatcher(nil)
	return p, nil
}
