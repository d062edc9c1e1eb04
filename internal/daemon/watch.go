package daemon

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/fsnotify/fsnotify"
)

// configWatcher watches what the configuration file's contents depend on:
// the directory of path, not the file itself, since editors and
// configuration managers replace files by renaming a new one over them
// (and Kubernetes swaps a symlink), which ends a watch on the file; and
// the directories of the symlinks path leads through and of the file it
// leads to, which may be elsewhere.
type configWatcher struct {
	w    *fsnotify.Watcher
	path string
	dirs []string // watched; see follow
}

// newWatcher starts watching the configuration at path.
func newWatcher(path string) (*configWatcher, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("daemon: config watch: %w", err)
	}
	if err := w.Add(filepath.Dir(path)); err != nil {
		w.Close()
		return nil, fmt.Errorf("daemon: config watch of %s: %w", filepath.Dir(path), err)
	}
	cw := &configWatcher{w: w, path: path}
	cw.follow()
	return cw, nil
}

// Close stops the watch.
func (cw *configWatcher) Close() error { return cw.w.Close() }

// follow watches the directories that path now depends on (see
// watchDirs), and no longer those it stopped depending on. A directory
// watched again is watched anew: one replaced since (removed and made
// again, or renamed over) is watched, not the one it replaced.
func (cw *configWatcher) follow() {
	dirs := watchDirs(cw.path)
	// Stale ones first: a directory still needed may be the same one
	// under another name.
	for _, dir := range cw.dirs {
		if !slices.Contains(dirs, dir) {
			cw.w.Remove(dir) // gone already when its directory was removed
		}
	}
	for _, dir := range dirs {
		// A directory missing now is one the file cannot be read
		// through: the reload reports that, and a change of the
		// directories still watched makes the next one.
		cw.w.Add(dir)
	}
	cw.dirs = dirs
}

// watchDirs returns the directories whose changes can change what reading
// path reads: its own, that of each symlink it leads through, and that of
// the file it leads to; and when path is a directory of configuration
// files, that directory itself (and the one it leads to).
func watchDirs(path string) []string {
	dirs := []string{filepath.Dir(path)}
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		dirs = append(dirs, filepath.Clean(path))
		if real, err := filepath.EvalSymlinks(path); err == nil {
			dirs = append(dirs, real)
		}
	}
	p := path
	for range 40 { // Linux's bound on the symlinks of one lookup
		target, err := os.Readlink(p)
		if err != nil {
			break
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(p), target)
		}
		p = target
		dirs = append(dirs, filepath.Dir(p))
	}
	if real, err := filepath.EvalSymlinks(path); err == nil {
		dirs = append(dirs, filepath.Dir(real))
	}
	slices.Sort(dirs)
	return slices.Compact(dirs)
}

// maxDebounces bounds the wait for changes in the configuration's
// directory to settle, in debounce intervals from the first change.
const maxDebounces = 10

// watch reloads the configuration after changes in its directories settle
// for the debounce interval, or at the latest maxDebounces intervals after
// the first of them (another file of the directory may never stop
// changing), until ctx ends; it owns and closes cw. A change that leaves
// the file's contents as they were is ignored. After each reload it
// follows the symlinks to the file again.
func (d *Daemon) watch(ctx context.Context, cw *configWatcher) {
	defer cw.Close()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var deadline time.Time // of the pending reload; zero when none is
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-cw.w.Events:
			if !ok {
				return
			}
			// A change of permissions counts: a file made readable again
			// may be read now, and a reload that could not read it be
			// made good. A change that leaves the contents as they were
			// costs one read.
			now := time.Now()
			if deadline.IsZero() {
				deadline = now.Add(maxDebounces * d.cfg.WatchDebounce)
			}
			timer.Reset(min(d.cfg.WatchDebounce, deadline.Sub(now)))
		case err, ok := <-cw.w.Errors:
			if !ok {
				return
			}
			d.log.Warn("config watch error", "err", err)
		case <-timer.C:
			deadline = time.Time{}
			// Followed before the file is read, so that a change made
			// meanwhile in a directory newly led through is seen.
			cw.follow()
			d.reload(false)
		}
	}
}
