package reserve_test

import (
	"testing"

	"github.com/sluicehq/sluice/internal/reserve"
	"github.com/sluicehq/sluice/internal/reserve/reservetest"
)

func TestMemoryConformance(t *testing.T) {
	reservetest.Run(t, func(*testing.T) reserve.Backend { return reserve.NewMemory(0) })
}
