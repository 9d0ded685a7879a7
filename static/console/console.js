// The console's shell: a notifications websocket per tab, toasts, and live-log hooks.
// No inline scripts anywhere (CSP script-src 'self').
(function () {
  "use strict";

  function toast(text) {
    var box = document.getElementById("toasts");
    if (!box || !window.bootstrap) return;
    var el = document.createElement("div");
    el.className = "toast align-items-center text-bg-dark border-0";
    el.setAttribute("role", "status");
    var body = document.createElement("div");
    body.className = "d-flex";
    var inner = document.createElement("div");
    inner.className = "toast-body";
    inner.textContent = text;
    body.appendChild(inner);
    el.appendChild(body);
    box.appendChild(el);
    new window.bootstrap.Toast(el, { delay: 5000 }).show();
  }

  function handle(msg) {
    document.dispatchEvent(new CustomEvent("console:notify", { detail: msg }));
    var log = document.querySelector("[data-live-log]");
    if (log && msg.kind !== "hello") {
      var li = document.createElement("li");
      li.textContent = new Date().toLocaleTimeString() + "  " + msg.kind + "  " + JSON.stringify(msg.payload);
      log.prepend(li);
    }
    if (msg.payload && msg.payload.token) {
      var pending = document.querySelector('[data-pending-token="' + msg.payload.token + '"]');
      if (pending && pending.parentElement) {
        pending.parentElement.classList.add("text-success");
        var spin = pending.parentElement.querySelector(".spinner-border");
        if (spin) spin.remove();
      }
    }
    if (msg.payload && msg.payload.message) toast(msg.payload.message);
  }

  // Reconnects back off (0.5 s doubling to 30 s, jittered). The backoff resets on the server's
  // hello, not on open: while its Redis is down the server accepts, then closes with 1013 "try
  // again later" before any hello, and resetting on open would retry every half second.
  function connect(path, attempt) {
    var proto = location.protocol === "https:" ? "wss://" : "ws://";
    var ws = new WebSocket(proto + location.host + path);
    ws.onmessage = function (ev) {
      var msg;
      try { msg = JSON.parse(ev.data); } catch (e) { return; /* ignore malformed frames */ }
      if (msg.kind === "hello") attempt = 0;
      try { handle(msg); } catch (e) { /* a broken page hook must not end the socket */ }
    };
    ws.onclose = function (ev) {
      if (ev.code === 4401 || ev.code === 4403) return; // not allowed: do not hammer
      var wait = Math.min(30000, 500 * Math.pow(2, attempt || 0));
      setTimeout(function () { connect(path, (attempt || 0) + 1); }, wait / 2 + Math.random() * wait / 2);
    };
  }

  // A control that belongs to another form (its form= attribute names a form elsewhere, like the
  // order page's asset search) is not a change of the form it sits in: its change event stops
  // here, before an enclosing htmx form (hx-trigger="change from:...") re-quotes and pushes an
  // address while the control's own form is being sent.
  document.addEventListener("change", function (ev) {
    var el = ev.target;
    if (el && el.form && el.getAttribute && el.getAttribute("form") && el.closest("form") !== el.form) {
      ev.stopPropagation();
    }
  }, true);

  document.addEventListener("DOMContentLoaded", function () {
    var path = document.body.getAttribute("data-notify-ws");
    if (path && "WebSocket" in window) connect(path, 0);
  });
  window.consoleToast = toast;
})();
