// Command sluice migrates with Sluice's runner, as `sluice migrate` does.
package main

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/sluicehq/sluice/internal/analytics/pganalytics"
)

func main() {
	applied, err := pganalytics.MigrateURL(context.Background(), os.Args[1])
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(applied)
}
