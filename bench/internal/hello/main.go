// Command hello is the reference of the cold-start benchmark: the smallest
// Go HTTP server that answers POST /api/v1/check with 200, so that the
// benchmark shows what Sluice adds to starting a Go process and a listener.
package main

import (
	"flag"
	"log"
	"net/http"
)

func main() {
	addr := flag.String("http-addr", "127.0.0.1:8080", "listen address")
	flag.Parse()
	http.HandleFunc("POST /api/v1/check", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"allowed":true}`))
	})
	log.Fatal(http.ListenAndServe(*addr, nil))
}
