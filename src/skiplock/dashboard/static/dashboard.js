// skiplock dashboard: live regions refresh by polling their fragment (no library, no build step).
// A region is skipped while focus is inside it (so keyboard users do not lose their place).
(function () {
  "use strict";
  function poll(region) {
    var url = region.getAttribute("data-live");
    var every = Math.max(1, parseFloat(region.getAttribute("data-every") || "3")) * 1000;
    function tick() {
      if (document.hidden || region.contains(document.activeElement)) { return schedule(); }
      fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (r) {
          if (r.status === 401 || r.redirected) { window.location.reload(); return null; }
          return r.ok ? r.text() : null;
        })
        .then(function (html) { if (html !== null) { region.innerHTML = html; } })
        .catch(function () { /* the next tick tries again */ })
        .then(schedule);
    }
    function schedule() { window.setTimeout(tick, every); }
    schedule();
  }
  document.addEventListener("DOMContentLoaded", function () {
    var regions = document.querySelectorAll("[data-live]");
    for (var i = 0; i < regions.length; i++) { poll(regions[i]); }
  });
})();
