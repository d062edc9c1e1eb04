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

// watch reloads the configuration after changes in its directory settle
// for the debounce interval, until ctx ends; it owns and closes w. A change
// that leaves the file's contents as they were is ignored.
func (d *Daemon) watch(ctx context.Context, w *fsnotify.Watcher) {
	defer w.Close()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
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
			timer.Reset(d.cfg.WatchDebounce)
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			d.log.Warn("config watch error", "err", err)
		case <-timer.C:
			d.reload(false)
		}
	}
}
