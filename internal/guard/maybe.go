package guard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/sluicehq/sluice/store"
)

// ErrMaybeCounted is store.ErrMaybeCounted: wrapped, beside the reason,
// by the error of a call given up on after it was sent (at its deadline,
// because the store stalled, or because its caller went away), or that
// the store itself gave up on at the end of its context. The engine fails
// the local rules of its checks closed (engine.Config.MaybeCountedFailsClosed).
var ErrMaybeCounted = store.ErrMaybeCounted

// sentErr returns err, the error of a store call that was sent and
// returned, wrapping ErrMaybeCounted when the store gave up on the call at
// the end of its context (the guard's deadline, which a store that heeds
// its context may reach first, or its caller's): it may have been written
// to the store before; or that its connection gave up on at a read or
// write deadline (a server that stopped answering, which may run what it
// read when it resumes). A connection that could not be opened (a dial
// that timed out: a host loaded beyond its cores takes long to connect
// even to a killed server) never carried it.
func sentErr(err error) error {
	if err == nil || errors.Is(err, ErrMaybeCounted) || isAnswer(err) || dialFailed(err) ||
		!errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) && !errors.Is(err, os.ErrDeadlineExceeded) {
		return err
	}
	return fmt.Errorf("%w: %w", err, ErrMaybeCounted)
}

// dialFailed reports whether err is the failure to open a connection.
func dialFailed(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}
