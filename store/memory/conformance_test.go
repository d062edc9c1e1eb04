package memory

import (
	"testing"

	"github.com/sluicehq/sluice/store/storetest"
)

// TestConformance runs the store conformance suite on the memory store.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Store {
		return newStore(t, Config{})
	})
}
