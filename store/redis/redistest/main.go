package redistest

import (
	"fmt"
	"os"
	"slices"
	"testing"
)

// Shared is a set of servers started once for a package's tests, by its
// TestMain, where there is no testing.TB to stop them: Close stops them
// and removes their files.
type Shared struct {
	mt *mainTB
}

// StartShared starts, for a TestMain, a standalone server and, when
// cluster is set, a Redis Cluster shaped by opts. Either may be used by
// every test of the package (each with keys of its own). The caller
// closes the Shared once m.Run returns.
func StartShared(cluster bool, opts ClusterOptions) (srv *Server, c *Cluster, sh *Shared, err error) {
	mt := &mainTB{}
	sh = &Shared{mt: mt}
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(mainFailure)
			if !ok {
				panic(r)
			}
			sh.Close()
			srv, c, sh, err = nil, nil, nil, f.err
		}
	}()
	srv = Start(mt)
	if cluster {
		c = StartCluster(mt, opts)
	}
	return srv, c, sh, nil
}

// Close stops the servers and removes their directories.
func (sh *Shared) Close() {
	for _, f := range slices.Backward(sh.mt.cleanups) {
		f()
	}
	sh.mt.cleanups = nil
}

// mainTB is the testing.TB of StartShared: it keeps the cleanups for
// Close and turns a fatal failure into a panic that StartShared recovers.
// Only the methods the starters call are implemented; the embedded nil
// interface stands for the others.
type mainTB struct {
	testing.TB
	cleanups []func()
}

type mainFailure struct{ err error }

func (m *mainTB) Helper()          {}
func (m *mainTB) Cleanup(f func()) { m.cleanups = append(m.cleanups, f) }

func (m *mainTB) TempDir() string {
	dir, err := os.MkdirTemp("", "redistest")
	if err != nil {
		m.Fatalf("redistest: %v", err)
	}
	m.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func (m *mainTB) Fatalf(format string, args ...any) {
	panic(mainFailure{fmt.Errorf(format, args...)})
}

func (m *mainTB) Skipf(format string, args ...any) { m.Fatalf(format, args...) }
