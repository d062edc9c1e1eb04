// Stopping a daemon: Shutdown, and Close, its impatient form.

package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Shutdown stops the daemon gracefully: it reports itself not ready and,
// after Config.ShutdownDelay, stops accepting connections,
// lets the checks in flight finish until ctx ends (then cuts them off),
// stops every background goroutine and waits for it, and closes the store.
// Calling it again returns the first call's result.
func (d *Daemon) Shutdown(ctx context.Context) error {
	d.shutdownOnce.Do(func() { d.shutdownErr = d.shutdown(ctx) })
	return d.shutdownErr
}

func (d *Daemon) shutdown(ctx context.Context) error {
	d.health.Shutdown()
	d.draining.Store(true)
	if delay := d.cfg.ShutdownDelay; delay > 0 {
		d.log.Info("not ready; serving on before closing the listeners", "for", delay)
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	d.cancel()
	var errs []error
	grpcDone := make(chan struct{})
	go func() {
		d.grpcSrv.GracefulStop()
		close(grpcDone)
	}()
	if err := d.httpSrv.Shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("daemon: HTTP shutdown: %w", err))
		d.httpSrv.Close()
	}
	select {
	case <-grpcDone:
	case <-ctx.Done():
		d.grpcSrv.Stop()
		<-grpcDone
		errs = append(errs, fmt.Errorf("daemon: gRPC shutdown: %w", ctx.Err()))
	}
	if d.debugSrv != nil {
		d.debugSrv.Close()
	}
	if d.adminSrv != nil {
		d.adminSrv.Close()
	}
	d.wg.Wait()
	if d.keeper != nil {
		d.keeper.Close()
	}
	if err := d.closeControl(); err != nil {
		errs = append(errs, fmt.Errorf("daemon: closing the control plane: %w", err))
	}
	d.eng.Close()
	// No check runs any more: what the recorder holds is written now.
	d.closeAnalytics()
	// Spans a collector did not take are lost, not a failed shutdown.
	if err := d.stopTracing(ctx); err != nil {
		d.log.Warn("tracing: spans not flushed to the collector", "err", err)
	}
	if err := d.closeSync(); err != nil {
		errs = append(errs, fmt.Errorf("daemon: closing the sync: %w", err))
	}
	if err := d.closer(); err != nil {
		errs = append(errs, fmt.Errorf("daemon: closing the store: %w", err))
	}
	d.log.Info("sluice stopped")
	return errors.Join(errs...)
}

// Close stops the daemon at once, cutting off checks in flight.
func (d *Daemon) Close() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return d.Shutdown(ctx)
}
