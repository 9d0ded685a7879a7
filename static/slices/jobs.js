// A Slurm job's page (issue 31): its new output and state arrive over the instance's websocket
// as the console's follower reads them; the fragment polled every 2 s stays the fallback (and
// replaces this page's view with the database's, so nothing pushed can drift from it).
(function () {
  "use strict";
  var page = document.getElementById("job-page");
  if (!page || !("WebSocket" in window)) { return; }
  var scheme = location.protocol === "https:" ? "wss://" : "ws://";
  var ws = new WebSocket(scheme + location.host + page.dataset.ws);
  ws.onmessage = function (msg) {
    var data;
    try { data = JSON.parse(msg.data); } catch (e) { return; }
    if (data.kind !== "job" || !data.payload || data.payload.id !== page.dataset.job) { return; }
    var out = document.getElementById("job-output");
    if (out && data.payload.text) {
      out.appendChild(document.createTextNode(data.payload.text));
      out.scrollTop = out.scrollHeight;
    }
    var job = document.getElementById("job");
    if (job) { job.dataset.state = data.payload.state; }
    page.dataset.live = "ws";
  };
})();
