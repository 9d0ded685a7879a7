// Instance page: follow the instance over its websocket; the server renders, this only asks.
// A message (state, progress, event) makes the page re-fetch its live region (throttled) and
// append log lines. While the websocket is down (a network drop, or closed with 1013 "try again
// later" while the server's Redis is down) the page polls instead: every 2 s while the instance
// is on its way, every 10 s once it runs, not at all once released or failed. It reconnects with
// backoff (1 s doubling to 30 s, jittered) and stops polling when the socket says hello again.
(function () {
  "use strict";
  var FINAL = { running: 1, released: 1, failed: 1 };
  var DONE = { released: 1, failed: 1 }; // nothing changes any more: no polling
  var REFUSED = { 4401: 1, 4403: 1, 4404: 1 }; // not allowed or gone: do not reconnect
  function init() {
    var page = document.getElementById("instance-page");
    if (!page) return;
    var liveUrl = page.dataset.liveUrl;
    var pending = false, dirty = false, lastFetch = 0, pollTimer = null;
    // Folds the reader opened (a big instance's node list, a step's events) stay as they were
    // across the refreshes that replace them (restored in the swap, before anything is painted).
    // A node list too long to come with the page is asked for once open (?nodes=1).
    var folds = {};
    document.addEventListener("toggle", function (e) {
      var d = e.target;
      if (!d.dataset || !d.dataset.fold) return;
      folds[d.dataset.fold] = d.open;
      if (d.open && d.dataset.lazy) refresh();
    }, true);
    document.addEventListener("htmx:afterSwap", function () {
      document.querySelectorAll("details[data-fold]").forEach(function (d) {
        var open = folds[d.dataset.fold];
        if (open !== undefined && d.open !== open) d.open = open;
      });
    });
    // A change announced while a fetch is in flight is fetched again after it (dirty), so the
    // page never stays on a state read just before the change.
    function refresh() {
      var now = Date.now();
      if (pending) { dirty = true; return; }
      var wait = Math.max(0, 700 - (now - lastFetch));
      pending = true;
      dirty = false;
      setTimeout(function () {
        lastFetch = Date.now();
        var done = function () { pending = false; runningChanged(); if (dirty) refresh(); };
        var url = liveUrl + (folds.nodes ? "?nodes=1" : "");
        window.htmx.ajax("GET", url, { target: "#instance-live", swap: "outerHTML", select: "#instance-live" })
          .then(done, done);
      }, wait);
    }
    function appendEvent(p) {
      if (p.kind === "log") {
        var pre = document.getElementById("instance-logs");
        if (!pre) return;
        var t = new Date(p.at).toTimeString().slice(0, 8);
        pre.appendChild(document.createTextNode(t + " " + (p.node ? "[" + p.node + "] " : "") + p.text + "\n"));
        pre.scrollTop = pre.scrollHeight;
        return;
      }
      refreshEvents();
    }
    var eventsPending = false, eventsDirty = false;
    function refreshEvents() {
      if (eventsPending) { eventsDirty = true; return; }
      eventsPending = true;
      eventsDirty = false;
      setTimeout(function () {
        var done = function () { eventsPending = false; if (eventsDirty) refreshEvents(); };
        window.htmx.ajax("GET", liveUrl + "?part=events", { target: "#instance-events", swap: "outerHTML", select: "#instance-events" })
          .then(done, done);
      }, 500);
    }
    // The ETA counts down between events (each re-render of the live region restarts it from
    // the server's estimate); at zero it says "any moment" rather than going negative.
    var etaBase = null;
    function tickEta() {
      var el = document.getElementById("instance-eta");
      if (!el || !el.dataset.etaSeconds) { etaBase = null; return; }
      if (!etaBase || etaBase.el !== el) etaBase = { el: el, seconds: +el.dataset.etaSeconds, at: Date.now() };
      var left = Math.max(0, Math.round(etaBase.seconds - (Date.now() - etaBase.at) / 1000));
      var h = Math.floor(left / 3600), m = Math.floor(left % 3600 / 60), s = left % 60;
      var fmt = left <= 0 ? el.dataset.fmtNow : h ? el.dataset.fmtHm : m ? el.dataset.fmtMs : el.dataset.fmtS;
      el.textContent = fmt.replace("{h}", h).replace("{m}", m).replace("{s}", s);
    }
    setInterval(tickEta, 1000);
    // While running, the cost so far and the elapsed time move on their own: refresh them.
    setInterval(function () { if (state() === "running" && !document.hidden) refresh(); }, 15000);
    // The GPU charts, the terminal and the web ports exist only while the instance runs: when
    // it starts or stops running, their region is fetched again (no reload), and their scripts
    // (loaded with the page) are told to look for their elements ("instance:parts").
    var partsPending = false;
    function runningChanged() {
      var parts = document.getElementById("instance-running-parts");
      if (!parts || partsPending) return;
      var running = state() === "running";
      if (running === (parts.dataset.running === "1")) return;
      partsPending = true;
      var done = function () {
        partsPending = false;
        document.dispatchEvent(new CustomEvent("instance:parts"));
      };
      window.htmx.ajax("GET", liveUrl + "?part=running", { target: "#instance-running-parts", swap: "outerHTML", select: "#instance-running-parts" })
        .then(done, done);
    }
    function state() {
      var live = document.getElementById("instance-live");
      return live ? live.dataset.state : "";
    }
    var live = false; // the socket said hello: it carries every change, no polling
    function poll() {
      if (pollTimer || live || DONE[state()]) return;
      pollTimer = setTimeout(function () {
        pollTimer = null;
        if (live) return;
        if (!document.hidden) { refresh(); refreshEvents(); }
        poll();
      }, FINAL[state()] ? 10000 : 2000);
    }
    function stopPolling() { if (pollTimer) { clearTimeout(pollTimer); pollTimer = null; } }
    if (!("WebSocket" in window)) { poll(); return; }
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    var attempt = 0;
    function connect() {
      var ws = new WebSocket(scheme + location.host + page.dataset.ws);
      ws.onmessage = function (msg) {
        var data;
        try { data = JSON.parse(msg.data); } catch (e) { return; }
        if (data.kind === "hello") {
          // Joined (during an outage the server accepts, then closes with 1013 before any hello):
          // catch up on what changed while down, then follow the socket alone.
          live = true;
          attempt = 0;
          stopPolling();
          refresh();
          refreshEvents();
          return;
        }
        if (data.kind === "event") appendEvent(data.payload);
        if (data.kind === "logs") data.payload.forEach(appendEvent);
        if (data.kind === "state" || data.kind === "progress" || (data.kind === "event" && data.payload.kind !== "log")) refresh();
      };
      ws.onclose = function (e) {
        live = false;
        if (REFUSED[e.code]) return;
        poll();
        var wait = Math.min(30000, 1000 * Math.pow(2, attempt++));
        setTimeout(connect, wait / 2 + Math.random() * wait / 2);
      };
    }
    connect();
  }
  document.addEventListener("DOMContentLoaded", init);
})();
// Release buttons ask first (data-confirm); without JavaScript the release page asks instead.
document.addEventListener("submit", function (e) {
  var button = e.submitter;
  if (button && button.dataset.confirm && !window.confirm(button.dataset.confirm)) e.preventDefault();
});
