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
		addr         string
		readOnly     bool
		basePath     string
		allowedHosts []string
	)
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "Serve the web dashboard (backlogui)",
		Long: `Serve the web dashboard (backlogui) on --addr until SIGINT or SIGTERM.

It has no authentication: it binds to loopback by default, and warns when
--addr is not a loopback address. --read-only hides and refuses actions.

Against DNS rebinding (a page of another site whose name is pointed at
this address), it answers only requests for localhost, loopback addresses,
the address a request arrived at and the host name --addr gives; others
get 421 Misdirected Request. --allowed-host adds names, e.g. a proxy's.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkAddr(addr); err != nil {
				return err
			}
			hosts, err := uiHosts(addr, allowedHosts)
			if err != nil {
				return err
			}
			base := strings.TrimRight(basePath, "/")
			if base != "" && !strings.HasPrefix(base, "/") {
				return usagef("--base-path %q: want a path starting with /, e.g. /admin/queue", basePath)
			}
			q, err := a.readQueue(cmd.Context())
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
			h := backlogui.NewHandler(q, backlogui.WithBasePath(base), backlogui.WithReadOnly(readOnly), backlogui.WithLogger(log),
				backlogui.WithAllowedHosts(hosts...))
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
	f.StringSliceVar(&allowedHosts, "allowed-host", nil, "also answer requests for this host name, or host:port (repeat or comma-separate; * for any)")
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

// uiHosts is what the dashboard answers besides loopback and the address a
// request arrived at: the --allowed-host names, and the host --addr names
// when it is a name (an IP address is covered already). A bad
// --allowed-host is a usage error.
func uiHosts(addr string, allowed []string) (hosts []string, err error) {
	hosts = append(hosts, allowed...)
	if host, _, _ := net.SplitHostPort(addr); host != "" && net.ParseIP(host) == nil {
		hosts = append(hosts, host)
	}
	// NewHandler panics on a bad entry, as on a bad trusted origin; check
	// them before connecting, with a handler that serves nothing.
	defer func() {
		if p := recover(); p != nil {
			err = usagef("--allowed-host: %s", strings.TrimPrefix(fmt.Sprint(p), "backlogui: WithAllowedHosts: "))
		}
	}()
	backlogui.NewHandler(nil, backlogui.WithAllowedHosts(hosts...))
	return hosts, nil
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
