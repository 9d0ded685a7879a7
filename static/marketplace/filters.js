// Marketplace filters: leave empty fields out of htmx GET requests, so the URL pushed to the
// address bar (and shared) carries only the filters in use: /marketplace/?q=llama&gated=yes.
(function () {
  "use strict";
  document.addEventListener("htmx:configRequest", function (evt) {
    var form = evt.detail.elt;
    if (!form || !form.closest || !form.closest("[data-drop-empty-params]")) return;
    if (evt.detail.verb !== "get") return;
    var params = evt.detail.parameters;
    var keys = typeof params.keys === "function" ? Array.from(params.keys()) : Object.keys(params);
    keys.forEach(function (key) {
      var value = typeof params.get === "function" ? params.get(key) : params[key];
      if (value === "" || value === null) {
        if (typeof params.delete === "function") params.delete(key);
        else delete params[key];
      }
    });
  });
})();
