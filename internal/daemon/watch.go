package daemon

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// newWatcher watches the directory of path, not the file itself: editors
// and configuration managers replace files by renaming a new one over them
// (and Kubernetes swaps a symlink), which ends a watch on the file.
func newWatcher(path string) (*fsnotify.Watcher, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("daemon: config watch: %w", err)
	}
	if err := w.Add(filepath.Dir(path)); err != nil {
		w.Close()
		return nil, fmt.Errorf("daemon: config watch of %s: %w", filepath.Dir(path), err)
	}
	return w, nil
}

// maxDebounces bounds the wait for changes in the configuration's
// directory to settle, in debounce intervals from the first change.
const maxDebounces = 10

// watch reloads the configuration after changes in its directory settle
// for the debounce interval, or at the latest maxDebounces intervals after
// the first of them (another file of the directory may never stop
// changing), until ctx ends; it owns and closes w. A change that leaves
// the file's contents as they were is ignored.
func (d *Daemon) watch(ctx context.Context, w *fsnotify.Watcher) {
	defer w.Close()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var deadline time.Time // of the pending reload; zero when none is
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			if ev.Has(fsnotify.Chmod) && !ev.Has(fsnotify.Write|fsnotify.Create|fsnotify.Rename|fsnotify.Remove) {
				continue
			}
			now := time.Now()
			if deadline.IsZero() {
				deadline = now.Add(maxDebounces * d.cfg.WatchDebounce)
			}
			timer.Reset(min(d.cfg.WatchDebounce, deadline.Sub(now)))
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			d.log.Warn("config watch error", "err", err)
		case <-timer.C:
			deadline = time.Time{}
			d.reload(false)
		}
	}
}
