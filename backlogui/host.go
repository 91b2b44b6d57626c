package backlogui

import (
	"errors"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
)

// The Host check stops DNS rebinding. A page of another site
// (http://evil.example:8080) whose name the attacker then points at
// 127.0.0.1 is, to the browser, same-origin with whatever answers on
// 127.0.0.1:8080: it can read the dashboard, its CSRF cookie and token,
// and post actions that pass both CSRF checks (its Origin and the Host
// both say evil.example). Loopback binding does not help: the requests
// come from the victim's own browser. Only the Host header tells such a
// request apart, so the handler answers only hosts no other site can be
// served under:
//
//   - localhost and loopback IP addresses, at any port: a browser never
//     asks DNS about them, and a page at another port is another origin,
//     which cannot read these pages (so an SSH tunnel's port works);
//   - the IP address the request arrived at (the connection's local
//     address, so a dashboard listening on 10.0.0.5 or on all interfaces
//     answers http://10.0.0.5:8080/), at any port (a NAT or a container's
//     port mapping changes it): an IP address in a URL is not looked up
//     either;
//   - the names given with WithAllowedHosts, which the operator vouches
//     for ("*" for any host, when a proxy in front checks it).
//
// It applies with and without WithAuthorize: the hook guards actions, not
// pages, and whether the application's own authentication withstands a
// rebinding page depends on what it rests on (a cookie of the real name
// is never sent to evil.example; a VPN or an IP allow-list lets it
// through), which the handler cannot see.

// hostRule is one WithAllowedHosts entry: a lower-case name or canonical
// IP address, and a port ("" for any).
type hostRule struct{ name, port string }

// parseHostRule reads "name", "name:port", "10.0.0.5", "[::1]:8080" or
// "::1".
func parseHostRule(s string) (hostRule, error) {
	const want = `want a host name or IP address, optionally with a port ("ops.example.com", "ops.example.com:8443", "10.0.0.5"), not a URL`
	if strings.ContainsAny(s, "/@?# \t") {
		return hostRule{}, errHost(s, want)
	}
	name, port := s, ""
	if h, p, err := net.SplitHostPort(s); err == nil {
		name, port = h, p
		if n, err := strconv.ParseUint(p, 10, 16); err != nil || n == 0 {
			return hostRule{}, errHost(s, "the port is not a number from 1 to 65535")
		}
	} else if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		name = s[1 : len(s)-1]
	}
	if name == "" || strings.ContainsAny(name, "[]") {
		return hostRule{}, errHost(s, want)
	}
	return hostRule{name: canonicalHost(name), port: port}, nil
}

func errHost(s, why string) error { return errors.New(strconv.Quote(s) + ": " + why) }

// canonicalHost lower-cases a name and writes an IP address one way
// ("::1", not "0:0::1").
func canonicalHost(name string) string {
	if ip, err := netip.ParseAddr(name); err == nil {
		return ip.Unmap().String()
	}
	return strings.ToLower(name)
}

// splitHost splits a Host header into its canonical name and its port
// ("" when it has none).
func splitHost(host string) (name, port string) {
	if h, p, err := net.SplitHostPort(host); err == nil {
		return canonicalHost(h), p
	}
	return canonicalHost(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")), ""
}

// hostAllowed reports whether the dashboard answers r's Host.
func (h *handler) hostAllowed(r *http.Request) bool {
	if h.anyHost {
		return true
	}
	name, port := splitHost(r.Host)
	if name == "" {
		return false
	}
	if name == "localhost" {
		return true
	}
	if ip, err := netip.ParseAddr(name); err == nil {
		if ip.IsLoopback() {
			return true
		}
		if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
			if local, err := netip.ParseAddrPort(la.String()); err == nil && local.Addr().Unmap() == ip {
				return true
			}
		}
	}
	for _, rule := range h.hosts {
		if rule.name == name && (rule.port == "" || rule.port == port) {
			return true
		}
	}
	return false
}

// refuseHost answers a request for a host the dashboard does not serve:
// 421 Misdirected Request, in plain text, with neither a page nor a
// cookie nor a token.
func (h *handler) refuseHost(w http.ResponseWriter, r *http.Request) {
	h.cfg.logger.Warn("backlogui: refused a request for a host it does not serve (see WithAllowedHosts)",
		"host", r.Host, "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusMisdirectedRequest)
	_, _ = w.Write([]byte("421 Misdirected Request\n\nThis dashboard does not answer for the host " + strconv.Quote(r.Host) +
		". It answers localhost, loopback addresses and the address it listens on; to reach it under another name, " +
		"list that name with backlogui.WithAllowedHosts (backlog ui --allowed-host).\n"))
}
