// leasepool dashboard: live updates and small conveniences. No framework,
// no build step.
//
// Parts of a page marked data-live (each with an id) are re-rendered by
// fetching the page again and swapping them in, when the event stream
// (/api/v1/events, server-sent events) reports a change, at most about
// once a second. Without the stream (not served, or the connection fails)
// the page polls every few seconds instead.
(function () {
  "use strict";
  var live = document.querySelectorAll("[data-live][id]");
  var status = document.getElementById("live-status");
  var pending = false, running = false, pollTimer = null;
  // A page that is slow to render (the overview on a big store) refreshes
  // less often: at least four times its last render time apart.
  // A page may ask for a longer floor (data-live-min, in ms): the
  // overview's counts cost a scan of an index.
  var lastCost = 0, floor = 1000;
  live.forEach(function (el) { floor = Math.max(floor, Number(el.dataset.liveMin) || 0); });
  function gap() { return Math.max(floor, 4 * lastCost); }

  function setStatus(s) {
    if (status) { status.className = "live-status " + s; status.title = "live updates: " + s; }
    document.body.dataset.live = s;
  }

  // refresh fetches this page and replaces every data-live part, keeping
  // the checked boxes checked.
  function refresh() {
    if (running) { pending = true; return; }
    running = true;
    var started = Date.now();
    fetch(location.href, { headers: { "Accept": "text/html" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        live.forEach(function (el) {
          var next = doc.getElementById(el.id);
          if (!next) return;
          var checked = {};
          el.querySelectorAll("input[type=checkbox]:checked").forEach(function (c) { checked[c.value] = true; });
          // What the user is typing (a signal's payload) survives the
          // swap, by the field's id, and so does the focus.
          var typed = {}, focused = document.activeElement && el.contains(document.activeElement) ? document.activeElement.id : "";
          el.querySelectorAll("textarea[id], input[type=text][id]").forEach(function (c) { typed[c.id] = c.value; });
          el.innerHTML = next.innerHTML;
          el.querySelectorAll("input[type=checkbox]").forEach(function (c) { if (checked[c.value]) c.checked = true; });
          Object.keys(typed).forEach(function (id) { var c = document.getElementById(id); if (c && el.contains(c)) c.value = typed[id]; });
          if (focused && document.getElementById(focused)) document.getElementById(focused).focus();
        });
        document.body.dataset.refreshed = String(Number(document.body.dataset.refreshed || 0) + 1);
      })
      .catch(function () {})
      .finally(function () {
        running = false;
        lastCost = Date.now() - started;
        if (pending) { pending = false; setTimeout(refresh, gap()); }
      });
  }

  var timer = null;
  function changed() {
    if (timer) return;
    timer = setTimeout(function () { timer = null; refresh(); }, gap());
  }

  function poll() {
    if (pollTimer) return;
    setStatus("polling");
    pollTimer = setInterval(refresh, 3000);
  }

  function connect() {
    if (!window.EventSource) { poll(); return; }
    var es = new EventSource("/api/v1/events");
    // Close the stream when the page goes (also into the back/forward
    // cache): a browser allows only ~6 connections per server, and
    // streams left open would stall the next pages.
    window.addEventListener("pagehide", function () { es.close(); });
    es.onopen = function () {
      if (pollTimer) { clearInterval(pollTimer); pollTimer = null; }
      setStatus("connected");
      // The stream starts now: whatever changed between this page's
      // rendering and now came before it, so render once more.
      changed();
    };
    // Events may come named by type (the server lists the names on
    // <body data-events>) or unnamed: any of them means a change.
    es.onmessage = changed;
    (document.body.dataset.events || "").split(" ").forEach(function (name) {
      if (name) es.addEventListener(name, changed);
    });
    es.onerror = function () {
      // CLOSED: the server refused the stream (e.g. 404); EventSource
      // reconnects on its own otherwise. Poll meanwhile either way.
      poll();
      if (es.readyState === EventSource.CLOSED) setTimeout(connect, 15000);
    };
  }

  var all = document.getElementById("select-all");
  if (all) {
    all.addEventListener("change", function () {
      document.querySelectorAll("#task-list input[name=key]").forEach(function (c) { c.checked = all.checked; });
    });
  }
  document.querySelectorAll("button#cancel, button#bulk-cancel").forEach(function (b) {
    b.addEventListener("click", function (e) {
      if (!confirm("Cancel? Running handlers are stopped.")) e.preventDefault();
    });
  });

  if (live.length) { setStatus("connecting"); connect(); }
  // A page whose state can change without a task event (a flow's signal
  // or timer step) also asks again every data-live-poll ms.
  var every = 0;
  live.forEach(function (el) { every = Math.max(every, Number(el.dataset.livePoll) || 0); });
  if (every) setInterval(changed, every);
})();
