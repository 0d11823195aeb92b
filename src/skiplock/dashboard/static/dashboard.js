// skiplock dashboard: live regions are updated by server-sent events (GET /events/<page>: the
// region's HTML whenever it changed), and by polling their fragment where EventSource is missing or
// its stream cannot be opened (a proxy that buffers it, say). No library, no build step.
// An update is held back while focus is inside the region (keyboard users do not lose their place).
(function () {
  "use strict";
  function live(region) {
    var url = region.getAttribute("data-live");
    var events = region.getAttribute("data-events");
    var every = Math.max(1, parseFloat(region.getAttribute("data-every") || "3")) * 1000;
    var pending = null;
    function show(html) {
      if (region.contains(document.activeElement)) { pending = html; return; }
      pending = null;
      region.innerHTML = html;
      region.setAttribute("data-updated", String(Date.now()));
    }
    region.addEventListener("focusout", function () {
      window.setTimeout(function () { if (pending !== null) { show(pending); } }, 0);
    });
    function poll() {
      function tick() {
        if (document.hidden || region.contains(document.activeElement)) { return schedule(); }
        fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
          .then(function (r) {
            if (r.status === 401 || r.redirected) { window.location.reload(); return null; }
            return r.ok ? r.text() : null;
          })
          .then(function (html) { if (html !== null) { show(html); } })
          .catch(function () { /* the next tick tries again */ })
          .then(schedule);
      }
      function schedule() { window.setTimeout(tick, every); }
      region.setAttribute("data-mode", "polling");
      schedule();
    }
    if (!events || !window.EventSource) { return poll(); }
    var opened = false;
    var source = new EventSource(events, { withCredentials: true });
    region.setAttribute("data-mode", "events");
    source.addEventListener("open", function () { opened = true; });
    source.addEventListener("update", function (e) { show(e.data); });
    source.addEventListener("error", function () {
      // never opened (refused, or not a stream): poll instead; the poll reloads the page on a 401
      if (!opened || source.readyState === EventSource.CLOSED) { source.close(); poll(); }
      // else the browser reconnects by itself (the stream ends every few minutes by design)
    });
  }
  document.addEventListener("DOMContentLoaded", function () {
    var regions = document.querySelectorAll("[data-live]");
    for (var i = 0; i < regions.length; i++) { live(regions[i]); }
  });
})();
