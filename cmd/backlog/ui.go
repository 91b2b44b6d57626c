package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/backlogq/backlog/backlogui"
)

// uiShutdownTimeout bounds how long a stopping dashboard waits for the
// requests in flight.
const uiShutdownTimeout = 5 * time.Second

func (a *app) uiCommand() *cobra.Command {
	var (
		addr     string
		readOnly bool
		basePath string
	)
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "Serve the web dashboard (backlogui)",
		Long: `Serve the web dashboard (backlogui) on --addr until SIGINT or SIGTERM.

It has no authentication: it binds to loopback by default, and warns when
--addr is not a loopback address. --read-only hides and refuses actions.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkAddr(addr); err != nil {
				return err
			}
			base := strings.TrimRight(basePath, "/")
			if base != "" && !strings.HasPrefix(base, "/") {
				return usagef("--base-path %q: want a path starting with /, e.g. /admin/queue", basePath)
			}
			q, err := a.queue(cmd.Context())
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				var opErr *net.OpError
				if errors.As(err, &opErr) && opErr.Err != nil {
					err = opErr.Err // "bind: address already in use", without the repeated address
				}
				return fmt.Errorf("listening on %s: %w", addr, err)
			}
			tcp, _ := ln.Addr().(*net.TCPAddr)
			if tcp == nil || !tcp.IP.IsLoopback() {
				fmt.Fprintf(a.stderr, "backlog: warning: the dashboard listens on %s, not loopback, without authentication\n", ln.Addr())
			}
			log := slog.New(slog.NewTextHandler(a.stderr, nil))
			h := backlogui.NewHandler(q, backlogui.WithBasePath(base), backlogui.WithReadOnly(readOnly), backlogui.WithLogger(log))
			mux := http.NewServeMux()
			if base == "" {
				mux.Handle("/", h)
			} else {
				mux.Handle(base+"/", h)
				mux.Handle(base, http.RedirectHandler(base+"/", http.StatusFound))
			}
			srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second,
				ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
			fmt.Fprintf(cmd.OutOrStdout(), "serving the dashboard on %s\n", serveURL(tcp, ln.Addr(), base))
			served := make(chan error, 1)
			go func() { served <- srv.Serve(ln) }()
			select {
			case err := <-served:
				return fmt.Errorf("serving the dashboard: %w", err)
			case <-cmd.Context().Done():
			}
			ctx, cancel := context.WithTimeout(context.Background(), uiShutdownTimeout)
			defer cancel()
			if err := srv.Shutdown(ctx); err != nil {
				_ = srv.Close()
			}
			if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serving the dashboard: %w", err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "addr", "127.0.0.1:8080", "HOST:PORT to listen on (loopback by default; the dashboard has no authentication)")
	f.BoolVar(&readOnly, "read-only", false, "hide and refuse actions (retry, cancel, delete, pause, resume)")
	f.StringVar(&basePath, "base-path", "", "serve under this path prefix, e.g. /admin/queue")
	return cmd
}

// checkAddr checks --addr is HOST:PORT with a port number, as a usage error.
func checkAddr(addr string) error {
	if _, port, err := net.SplitHostPort(addr); err == nil {
		if _, err := strconv.ParseUint(port, 10, 16); err == nil {
			return nil
		}
	}
	return usagef("--addr %q: want HOST:PORT, e.g. 127.0.0.1:8080", addr)
}

// serveURL is the dashboard's URL: the listener's address, with localhost
// for an unspecified (all interfaces) one.
func serveURL(tcp *net.TCPAddr, addr net.Addr, base string) string {
	host := addr.String()
	if tcp != nil && tcp.IP.IsUnspecified() {
		host = net.JoinHostPort("localhost", strconv.Itoa(tcp.Port))
	}
	return "http://" + host + base + "/"
}
