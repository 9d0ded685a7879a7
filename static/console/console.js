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

  function connect(path, attempt) {
    var proto = location.protocol === "https:" ? "wss://" : "ws://";
    var ws = new WebSocket(proto + location.host + path);
    ws.onmessage = function (ev) {
      try { handle(JSON.parse(ev.data)); } catch (e) { /* ignore malformed frames */ }
    };
    ws.onopen = function () { attempt = 0; };
    ws.onclose = function (ev) {
      if (ev.code === 4401 || ev.code === 4403) return; // not allowed: do not hammer
      var wait = Math.min(30000, 500 * Math.pow(2, attempt || 0));
      setTimeout(function () { connect(path, (attempt || 0) + 1); }, wait);
    };
  }

  document.addEventListener("DOMContentLoaded", function () {
    var path = document.body.getAttribute("data-notify-ws");
    if (path && "WebSocket" in window) connect(path, 0);
  });
  window.consoleToast = toast;
})();
