// Command goose migrates with pressly/goose's Provider, over pgx's
// database/sql driver and under goose's PostgreSQL session lock, from the
// goose-annotated migrations in the directory of its second argument.
package main

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

func main() {
	db, err := sql.Open("pgx", os.Args[1])
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		log.Fatal(err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, os.DirFS(os.Args[2]), goose.WithSessionLocker(locker))
	if err != nil {
		log.Fatal(err)
	}
	results, err := p.Up(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(results)
}
