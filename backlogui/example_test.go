package backlogui_test

import (
	"errors"
	"log"
	"net"
	"net/http"
	"time"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/backlogui"
)

// The dashboard mounted under /admin/queue/ of an application's own mux,
// behind its own authentication, with actions only for on-call engineers.
func ExampleNewHandler() {
	var q *backlog.Queue                                           // your queue (backlog.New)
	requireLogin := func(h http.Handler) http.Handler { return h } // your authentication middleware
	isOnCall := func(r *http.Request) bool { return r.Header.Get("X-On-Call") == "yes" }

	ui := backlogui.NewHandler(q,
		backlogui.WithBasePath("/admin/queue"),
		backlogui.WithAllowedHosts("ops.example.com"), // the name it is reached by, beyond localhost
		backlogui.WithAuthorize(func(r *http.Request, action string) error {
			if !isOnCall(r) {
				return errors.New("only on-call engineers may " + action)
			}
			return nil
		}))
	mux := http.NewServeMux()
	mux.Handle("/admin/queue/", requireLogin(ui))
	_ = mux
}

// A standalone dashboard server, as a command would run it: bound to
// loopback, read-only unless asked otherwise.
func ExampleNewHandler_standalone() {
	var q *backlog.Queue // your queue (backlog.New)
	addr := "127.0.0.1:8080"
	if host, _, err := net.SplitHostPort(addr); err == nil {
		if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			log.Printf("warning: the dashboard listens on %s without authentication", addr)
		}
	}
	srv := &http.Server{Addr: addr, Handler: backlogui.NewHandler(q, backlogui.WithReadOnly(true)),
		ReadHeaderTimeout: 10 * time.Second}
	_ = srv // srv.ListenAndServe()
}
