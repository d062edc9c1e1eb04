package guard

import "time"

// Observer receives the guard's events as they happen, for metrics (the
// daemon adapts it to its metrics package). Its methods are called on the
// path of checks: they must be safe for concurrent use and quick.
type Observer interface {
	// BreakerChanged is called on every change of the breaker's state,
	// with the breaker's lock held: it must not call the guard.
	BreakerChanged(to BreakerState)
	// StoreCall is called after every store call, with the time its
	// caller waited and its error.
	StoreCall(d time.Duration, err error)
	// OverLimitCacheHit is called for every request denied by the
	// over-limit cache, and OverLimitEntries with the number of keys it
	// holds whenever it changes.
	OverLimitCacheHit()
	OverLimitEntries(n int)
	// HotKeyDetected is called when a key becomes hot, and HotKeys with
	// the number of hot keys whenever it changes.
	HotKeyDetected()
	HotKeys(n int)
	// HotKeySync is called after every successful sync of the hot keys'
	// leases, with the time since the previous one.
	HotKeySync(lag time.Duration)
	// HotKeySyncCall is called after every store call of a sync of the
	// hot keys' leases, failed ones included, with its duration and
	// error: the guard makes these calls on its own, so no caller of the
	// guard times them.
	HotKeySyncCall(d time.Duration, err error)
	// Gathered is called after every store call of gathered checks (see
	// Config.Gatherers), with the number of checks it decided.
	Gathered(n int)
}

// nopObserver is the Observer of a guard configured without one.
type nopObserver struct{}

func (nopObserver) BreakerChanged(BreakerState)         {}
func (nopObserver) StoreCall(time.Duration, error)      {}
func (nopObserver) OverLimitCacheHit()                  {}
func (nopObserver) OverLimitEntries(int)                {}
func (nopObserver) HotKeyDetected()                     {}
func (nopObserver) HotKeys(int)                         {}
func (nopObserver) HotKeySync(time.Duration)            {}
func (nopObserver) HotKeySyncCall(time.Duration, error) {}
func (nopObserver) Gathered(int)                        {}
