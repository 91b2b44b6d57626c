// backlog dashboard: live refresh of the #live part of a page, local
// times, "select all". No inline scripts (the CSP forbids them).
(function () {
  "use strict";

  var units = [["d", 86400], ["h", 3600], ["m", 60], ["s", 1]];

  function rel(ms) {
    var future = ms < 0;
    var s = Math.floor(Math.abs(ms) / 1000);
    if (s < 1) return "just now";
    var out = [];
    for (var i = 0; i < units.length && out.length < 2; i++) {
      var n = Math.floor(s / units[i][1]);
      if (n > 0 || out.length > 0) {
        out.push(n + units[i][0]);
        s -= n * units[i][1];
      }
    }
    return future ? "in " + out.join(" ") : out.join(" ") + " ago";
  }

  // Times: relative text, the absolute time in the viewer's zone on hover.
  function times(root) {
    var els = root.querySelectorAll("time[datetime]");
    var now = Date.now();
    for (var i = 0; i < els.length; i++) {
      var t = Date.parse(els[i].getAttribute("datetime"));
      if (isNaN(t)) continue;
      var abs = new Date(t).toLocaleString(undefined, { dateStyle: "medium", timeStyle: "medium" });
      els[i].title = abs;
      els[i].textContent = rel(now - t);
    }
  }

  function selectAll() {
    var all = document.getElementById("select-all");
    if (!all) return;
    all.addEventListener("change", function () {
      var boxes = document.querySelectorAll('#live input[name="id"]');
      for (var i = 0; i < boxes.length; i++) boxes[i].checked = all.checked;
    });
  }

  var live = document.getElementById("live");
  var status = document.getElementById("live-status");
  var every = parseInt(document.body.getAttribute("data-refresh"), 10) || 2000;
  var busy = false;

  function refresh() {
    if (!live || busy || document.hidden) return;
    // Never pull the page from under a keyboard user or a pending click.
    if (live.contains(document.activeElement) && document.activeElement !== document.body) {
      var a = document.activeElement;
      if (a.tagName !== "INPUT" || a.type !== "checkbox") return;
    }
    busy = true;
    fetch(location.href, { headers: { "X-Backlog-Live": "1" }, credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.text();
      })
      .then(function (html) {
        var checked = {};
        var boxes = live.querySelectorAll('input[name="id"]:checked');
        for (var i = 0; i < boxes.length; i++) checked[boxes[i].value] = true;
        var focused = document.activeElement && live.contains(document.activeElement) ? document.activeElement.value : null;
        live.innerHTML = html;
        boxes = live.querySelectorAll('input[name="id"]');
        for (var j = 0; j < boxes.length; j++) {
          if (checked[boxes[j].value]) boxes[j].checked = true;
          if (focused && boxes[j].value === focused) boxes[j].focus();
        }
        times(live);
        selectAll();
        if (status) status.textContent = "live";
        document.dispatchEvent(new CustomEvent("backlog:refreshed"));
      })
      .catch(function (e) {
        if (status) status.textContent = "refresh failed: " + e.message;
      })
      .then(function () { busy = false; });
  }

  // On a phone, an unfiltered jobs page starts with its filters folded.
  var filters = document.getElementById("filters");
  if (filters && !location.search && window.matchMedia("(max-width: 760px)").matches) filters.open = false;

  times(document);
  selectAll();
  if (live) {
    if (status) status.textContent = "live";
    setInterval(refresh, every);
    document.addEventListener("visibilitychange", function () { if (!document.hidden) refresh(); });
  }
  setInterval(function () { times(document); }, 1000);
})();
