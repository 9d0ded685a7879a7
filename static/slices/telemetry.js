// Live GPU telemetry in the browser (uPlot, vendored): the instance page's charts, the operators'
// cluster heat map and a node's GPUs. The last hour is drawn at once from the ring (one JSON
// request), then one point a second arrives over the websocket; a reconnect fetches only the gap.
(function () {
  "use strict";
  var MAX_POINTS = 3600;
  var PER_GPU_MAX = 16;
  // Beyond this many GPUs live samples carry no per-GPU detail (slices.telemetry.relay's
  // DETAIL_MAX_GPUS): the table shows a row per node instead.
  var DETAIL_MAX_GPUS = 64;
  var COLOURS = ["#0d6efd", "#6f42c1", "#d63384", "#fd7e14", "#198754", "#20c997", "#0dcaf0", "#ffc107",
    "#6610f2", "#dc3545", "#6c757d", "#198754", "#0a58ca", "#a61e4d", "#e8590c", "#2b8a3e"];
  // Row columns (slices.telemetry.samples.ROW_COLUMNS): node, gpu, util, mem_used, temp, power, xid, lost
  var METRICS = [
    { key: "util", col: 2, scale: 1, range: [0, 100] },
    { key: "mem", col: 3, scale: 1 / 1024, range: null },
    { key: "temp", col: 4, scale: 1, range: null },
    { key: "power", col: 5, scale: 1, range: null }
  ];

  // Times and numbers in the page's language (<html lang>, set by Django): 24-hour times, never
  // uPlot's US default ("12/3/26 9:54pm"). hourCycle h23 rather than hour12: false, which some
  // locales (en) read as h24 and print "24:05:07" for five past midnight.
  var LANG = document.documentElement.lang || undefined;
  function dateFormat(opts) {
    try { return new Intl.DateTimeFormat(LANG, opts); } catch (e) { return new Intl.DateTimeFormat(undefined, opts); }
  }
  var HMS = dateFormat({ hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23" });
  var HM = dateFormat({ hour: "2-digit", minute: "2-digit", hourCycle: "h23" });
  function numberFormat(digits) {
    var opts = { maximumFractionDigits: digits };
    try { return new Intl.NumberFormat(LANG, opts); } catch (e) { return new Intl.NumberFormat(undefined, opts); }
  }
  var NUM = numberFormat(1), TICK = numberFormat(2);
  function clock(ts) { return ts === null || ts === undefined ? "" : HMS.format(new Date(ts * 1000)); }
  function number(v) { return v === null || v === undefined ? "—" : NUM.format(v); }

  function wsUrl(path) {
    return (location.protocol === "https:" ? "wss://" : "ws://") + location.host + path;
  }

  function text(node, value) {
    node.textContent = value;
    return node;
  }

  function heatColour(v) {
    if (v === null || v === undefined) return "#dee2e6";
    var x = Math.max(0, Math.min(100, v)) / 100;
    var hue = 220 - 220 * x; // blue (idle) → red (busy)
    return "hsl(" + hue + ", 75%, " + (55 - 10 * x) + "%)";
  }

  var POLL_MS = 5000;

  // A cluster's live frame (slices/telemetry/heat.py): the host names and, base64, the GPUs per
  // host (a byte each), then for every GPU in host order its index, util % and temp °C (a byte
  // column each), its power in W and memory in 16 MiB (u16 little-endian columns); 255 / 65535
  // mean "not read". Returns {host: [[gpu, util, temp, power, mem MiB], …]}, the shape of the
  // first frame (JSON).
  function heatNodes(payload) {
    if (!payload.packed) return payload.nodes || {};
    var bin = atob(payload.packed), hosts = payload.hosts || [], h = hosts.length, n = 0, i;
    for (i = 0; i < h; i++) n += bin.charCodeAt(i);
    if (bin.length !== h + 7 * n) return {};
    function u8(at) { var v = bin.charCodeAt(at); return v === 255 ? null : v; }
    function u16(at) { var v = bin.charCodeAt(at) | (bin.charCodeAt(at + 1) << 8); return v === 65535 ? null : v; }
    var nodes = {}, g = 0;
    hosts.forEach(function (host, k) {
      var gpus = [];
      for (var c = bin.charCodeAt(k); c > 0; c--, g++) {
        var mem = u16(h + 5 * n + 2 * g);
        gpus.push([bin.charCodeAt(h + g), u8(h + n + g), u8(h + 2 * n + g), u16(h + 3 * n + 2 * g), mem === null ? null : mem * 16]);
      }
      nodes[host] = gpus;
    });
    return nodes;
  }

  // Follow a websocket with back-off; ``onOpen`` runs on every (re)connect, once the server said
  // hello (joined the stream: while its Redis is down it accepts, then closes with 1013 "try
  // again later" before any hello). While the socket is down, ``poll`` (if given) runs every
  // POLL_MS so the view keeps moving over plain HTTP; reconnects back off 1 s doubling to 15 s,
  // jittered, so a recovered server is not hit by every tab at once.
  function follow(path, onSample, onOpen, onStatus, poll) {
    var delay = 1000, pollTimer = null;
    function startPolling() {
      if (poll && !pollTimer) pollTimer = setInterval(function () { if (!document.hidden) poll(); }, POLL_MS);
    }
    function stopPolling() { if (pollTimer) { clearInterval(pollTimer); pollTimer = null; } }
    function connect() {
      var ws = new WebSocket(wsUrl(path));
      ws.onmessage = function (msg) {
        var data;
        try { data = JSON.parse(msg.data); } catch (e) { return; }
        if (data.kind === "hello") { delay = 1000; stopPolling(); onStatus("live"); onOpen(); return; }
        if (data.kind === "sample") {
          onSample(data.payload, data.skipped || 0);
          // Drawn: ask for the next one (the server holds back all but the newest meanwhile).
          if (ws.readyState === 1) ws.send('{"kind":"ack"}');
        }
      };
      ws.onclose = function (e) {
        if (e.code === 4401 || e.code === 4403 || e.code === 4404) { stopPolling(); onStatus("closed"); return; }
        onStatus("reconnecting");
        startPolling();
        setTimeout(connect, delay / 2 + Math.random() * delay / 2);
        delay = Math.min(delay * 2, 15000);
      };
    }
    if ("WebSocket" in window) connect(); else { onStatus("closed"); startPolling(); }
  }

  // --- the instance page ----------------------------------------------------------------------
  function initInstance(card) {
    var labels = card.dataset;
    var status = card.querySelector("[data-telemetry-status]");
    var grid = card.querySelector("[data-telemetry-charts]");
    var table = card.querySelector("[data-telemetry-table] tbody");
    var notice = card.querySelector("[data-telemetry-notice]");
    var idleBox = card.querySelector("[data-telemetry-idle]");
    var gpuBox = card.querySelector("[data-telemetry-gpus-box]");
    var nodeBox = card.querySelector("[data-telemetry-nodes-box]");
    var nodeBody = card.querySelector("[data-telemetry-nodes] tbody");
    var nodeRows = {};
    var charts = [], data = [], seriesIndex = {}, seriesCount = 0, perGpu = true, hosts = [];
    var xs = [], lastTs = 0, loaded = false, buffer = [];

    function setStatus(s) {
      status.dataset.status = s;
      status.textContent = labels["status" + s.charAt(0).toUpperCase() + s.slice(1)] || s;
      status.className = "badge " + (s === "live" ? "text-bg-success" : "text-bg-secondary");
    }

    function seriesFor(rows) {
      // One series per GPU (small instances) plus the mean; big slices: mean, min and max.
      var keys = rows.map(function (r) { return r[0] + ":" + r[1]; }).sort(function (a, b) {
        var pa = a.split(":").map(Number), pb = b.split(":").map(Number);
        return pa[0] - pb[0] || pa[1] - pb[1];
      });
      perGpu = keys.length <= PER_GPU_MAX;
      var out = [];
      if (perGpu) {
        keys.forEach(function (k, i) {
          var p = k.split(":");
          seriesIndex[k] = i;
          out.push({ label: (hosts.length > 1 ? "#" + p[0] + " " : "") + "GPU " + p[1], stroke: COLOURS[i % COLOURS.length], width: 1 });
        });
        out.push({ label: labels.mean, stroke: "#212529", width: 2, dash: [6, 3] });
      } else {
        out.push({ label: labels.mean, stroke: "#0d6efd", width: 2 });
        out.push({ label: labels.min, stroke: "#adb5bd", width: 1 });
        out.push({ label: labels.max, stroke: "#dc3545", width: 1 });
      }
      seriesCount = out.length;
      return out;
    }

    function build(rows) {
      var series = seriesFor(rows);
      var width = Math.max(280, (grid.clientWidth || 800) / (grid.clientWidth > 700 ? 2 : 1) - 16);
      METRICS.forEach(function (m) {
        var box = document.createElement("div");
        box.className = "col";
        box.dataset.metric = m.key;
        var title = text(document.createElement("div"), labels[m.key]);
        title.className = "small fw-semibold";
        box.appendChild(title);
        grid.appendChild(box);
        var d = [xs];
        for (var i = 0; i < seriesCount; i++) d.push([]);
        data.push(d);
        var opts = {
          width: width,
          height: 180,
          legend: { show: perGpu ? false : true },
          cursor: { drag: { x: false, y: false } },
          scales: { x: { time: true }, y: m.range ? { range: m.range } : { auto: true } },
          series: [{ label: labels.time, value: function (u, ts) { return clock(ts); } }].concat(series.map(function (s) {
            return Object.assign({ points: { show: false }, spanGaps: false, value: function (u, v) { return number(v); } }, s);
          })),
          axes: [
            // One point a second: ticks whole seconds apart (uPlot would split a young chart's
            // few seconds into tenths, all printed as the same second), room for HH:MM:SS.
            { space: 70, incrs: [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200],
              values: function (u, ticks, axis, space, incr) {
              var f = incr >= 60 ? HM : HMS; // whole minutes apart: no seconds
              return ticks.map(function (t) { return t === null ? "" : f.format(new Date(t * 1000)); });
            } },
            { size: 60, values: function (u, vals) { return vals.map(function (v) { return v === null ? "" : TICK.format(v); }); } }
          ]
        };
        charts.push(new window.uPlot(opts, d, box));
      });
    }

    function add(entry) {
      if (entry.ts <= lastTs) return false;
      var rows = entry.g || [];
      if (!charts.length) {
        if (!rows.length) return false;
        build(rows);
      }
      lastTs = entry.ts;
      xs.push(entry.ts);
      METRICS.forEach(function (m, mi) {
        var d = data[mi], vals = [], i;
        for (i = 1; i <= seriesCount; i++) d[i].push(null);
        rows.forEach(function (r) {
          var v = r[m.col];
          if (v === null || v === undefined) return;
          v = v * m.scale;
          vals.push(v);
          if (perGpu) {
            var idx = seriesIndex[r[0] + ":" + r[1]];
            if (idx !== undefined) d[idx + 1][d[idx + 1].length - 1] = v;
          }
        });
        if (vals.length) {
          var mean = vals.reduce(function (a, b) { return a + b; }, 0) / vals.length;
          var n = xs.length - 1;
          if (perGpu) d[seriesCount][n] = mean;
          else { d[1][n] = mean; d[2][n] = Math.min.apply(null, vals); d[3][n] = Math.max.apply(null, vals); }
        }
      });
      if (xs.length > MAX_POINTS) {
        xs.shift();
        data.forEach(function (d) { for (var i = 1; i < d.length; i++) d[i].shift(); });
      }
      return true;
    }

    function redraw() {
      charts.forEach(function (c, i) { c.setData(data[i]); });
      card.dataset.points = String(xs.length);
      card.dataset.firstTs = String(xs.length ? xs[0] : 0);
      card.dataset.lastTs = String(lastTs);
    }

    function showDetail(payload) {
      if (payload.problems && payload.problems.length) {
        notice.hidden = false;
        notice.textContent = payload.problems.map(function (p) {
          return p.host + ": " + (p.state === "nvml_unavailable" ? labels.nvmlUnavailable : p.state) + (p.error ? " (" + p.error + ")" : "");
        }).join(" · ");
      } else {
        notice.hidden = true;
      }
      if (!payload.detail) {
        if ((payload.g || []).length > DETAIL_MAX_GPUS) showNodes(payload.g);
        return;
      }
      if (!table) return;
      var byKey = {};
      (payload.g || []).forEach(function (r) { byKey[r[0] + ":" + r[1]] = r; });
      table.replaceChildren();
      payload.detail.forEach(function (d) {
        var r = byKey[d.node + ":" + d.index] || [];
        var tr = document.createElement("tr");
        var cells = [
          (hosts.length > 1 ? "#" + d.node + " " : "") + d.index,
          d.state === "lost" ? labels.lost : (r[2] !== null && r[2] !== undefined ? r[2] + " %" : "—"),
          r[3] !== null && r[3] !== undefined ? (r[3] / 1024).toFixed(1) + " / " + ((d.mem_total || 0) / 1024).toFixed(0) + " GiB" : "—",
          r[4] !== null && r[4] !== undefined ? r[4] + " °C" : "—",
          r[5] !== null && r[5] !== undefined ? Math.round(r[5]) + " / " + Math.round(d.power_limit || 0) + " W" : "—",
          d.sm_clock !== null && d.sm_clock !== undefined ? d.sm_clock + " MHz" : "—",
          d.pcie_tx !== null && d.pcie_tx !== undefined ? (d.pcie_tx / 1024).toFixed(0) + " / " + (d.pcie_rx / 1024).toFixed(0) + " MB/s" : "—",
          (d.ecc_corrected === null ? "—" : d.ecc_corrected) + " / " + (d.ecc_uncorrected === null ? "—" : d.ecc_uncorrected),
          (d.throttle || []).join(", ") || "—",
          (d.xid || []).join(", ") || ""
        ];
        cells.forEach(function (c, i) {
          var td = text(document.createElement("td"), c);
          if (i === 9 && c) td.className = "text-danger fw-semibold";
          tr.appendChild(td);
        });
        if (d.state === "lost" || (d.xid && d.xid.length)) tr.className = "table-danger";
        table.appendChild(tr);
      });
    }

    // A slice too big for a row per GPU: a row per node, its GPUs as cells coloured by
    // utilisation (a heat map of the slice, a node a line) and their min / mean / max, memory,
    // hottest GPU, power drawn; a node with a lost GPU or an Xid is marked. Rows are made once
    // and their text updated in place (1,024 GPUs a second).
    function nodeRow(rank) {
      var tr = document.createElement("tr");
      tr.dataset.rank = String(rank);
      var cells = [];
      for (var i = 0; i < 7; i++) cells.push(tr.appendChild(document.createElement("td")));
      var strip = document.createElement("div");
      strip.className = "d-flex gap-1";
      cells[1].appendChild(strip);
      text(cells[0], "#" + rank + (hosts[rank] ? " " + hosts[rank] : ""));
      return { tr: tr, cells: cells, strip: strip, dots: [] };
    }
    function setText(td, value) { if (td.textContent !== value) td.textContent = value; }
    function showNodes(rows) {
      if (!nodeBody || !nodeBox) return;
      var by = {};
      rows.forEach(function (r) { (by[r[0]] = by[r[0]] || []).push(r); });
      var ranks = Object.keys(by).map(Number).sort(function (a, b) { return a - b; });
      var added = false;
      ranks.forEach(function (rank) {
        var row = nodeRows[rank];
        if (!row) { row = nodeRows[rank] = nodeRow(rank); added = true; }
        var gpus = by[rank].sort(function (a, b) { return a[1] - b[1]; });
        var utils = [], mem = 0, memN = 0, temp = null, power = 0, powerN = 0, xid = 0, lost = 0;
        while (row.dots.length < gpus.length) {
          var dot = row.strip.appendChild(document.createElement("span"));
          dot.className = "rounded-1 d-inline-block";
          dot.style.width = "0.6rem";
          dot.style.height = "0.9rem";
          row.dots.push(dot);
        }
        while (row.dots.length > gpus.length) row.strip.removeChild(row.dots.pop());
        gpus.forEach(function (r, i) {
          var u = r[2];
          if (u !== null && u !== undefined) utils.push(u);
          if (r[3] !== null && r[3] !== undefined) { mem += r[3]; memN++; }
          if (r[4] !== null && r[4] !== undefined) temp = temp === null ? r[4] : Math.max(temp, r[4]);
          if (r[5] !== null && r[5] !== undefined) { power += r[5]; powerN++; }
          xid += r[6] || 0;
          lost += r[7] || 0;
          var colour = heatColour(r[7] ? null : u);
          if (row.dots[i].dataset.colour !== colour) { row.dots[i].dataset.colour = colour; row.dots[i].style.background = colour; }
          var tip = "GPU " + r[1] + ": " + (r[7] ? labels.lost : (u === null || u === undefined ? "—" : u + " %"));
          if (row.dots[i].title !== tip) row.dots[i].title = tip;
        });
        var mean = utils.length ? utils.reduce(function (a, b) { return a + b; }, 0) / utils.length : null;
        setText(row.cells[2], utils.length ? Math.min.apply(null, utils) + " / " + NUM.format(mean) + " / " + Math.max.apply(null, utils) + " %" : "—");
        setText(row.cells[3], memN ? NUM.format(mem / memN / 1024) + " GiB" : "—");
        setText(row.cells[4], temp === null ? "—" : temp + " °C");
        setText(row.cells[5], powerN ? NUM.format(Math.round(power)) + " W" : "—");
        setText(row.cells[6], (xid ? String(xid) : "") + (lost ? (xid ? " · " : "") + lost + " " + labels.lost : ""));
        var bad = lost || xid ? "table-danger" : "";
        if (row.tr.className !== bad) row.tr.className = bad;
      });
      // A node missing from this sample (its agent not answering: the notice above says why):
      // no stale figures.
      Object.keys(nodeRows).forEach(function (rank) {
        if (by[rank]) return;
        var row = nodeRows[rank];
        for (var i = 2; i < 7; i++) setText(row.cells[i], "—");
        row.dots.forEach(function (dot) { dot.dataset.colour = ""; dot.style.background = heatColour(null); });
      });
      if (added) {
        Object.keys(nodeRows).map(Number).sort(function (a, b) { return a - b; })
          .forEach(function (rank) { nodeBody.appendChild(nodeRows[rank].tr); }); // in rank order
      }
      if (gpuBox) gpuBox.hidden = true;
      nodeBox.hidden = false;
      card.dataset.nodeRows = String(nodeBody.children.length);
    }

    function showIdle(idle) {
      if (!idleBox) return;
      if (!idle) { idleBox.hidden = true; return; }
      idleBox.hidden = false;
      idleBox.querySelector("[data-idle-text]").textContent = idle.text;
      idleBox.querySelector("[data-idle-release]").hidden = !idle.release;
    }

    function fetchHistory() {
      var url = card.dataset.historyUrl + (lastTs ? "?since=" + encodeURIComponent(lastTs) : "");
      return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (r) { if (!r.ok) throw new Error(r.status); return r.json(); })
        .then(function (h) {
          hosts = h.hosts || hosts;
          (h.entries || []).forEach(add);
          buffer.forEach(add);
          buffer = [];
          loaded = true;
          showIdle(h.idle);
          redraw();
          var last = (h.entries || [])[(h.entries || []).length - 1];
          if (last && (last.g || []).length > DETAIL_MAX_GPUS) showNodes(last.g);
        });
    }

    fetchHistory().catch(function () { loaded = true; }); // draw the past hour even without a websocket
    var polling = false, pollFailures = 0, nextPollAt = 0;
    follow(card.dataset.ws, function (payload) {
      if (!loaded) { buffer.push(payload); return; }
      if (add(payload)) redraw();
      showDetail(payload);
    }, function () {
      loaded = false; // hold live samples until the gap since the last one is drawn
      fetchHistory().catch(function () { loaded = true; });
    }, setStatus, function () {
      // Socket down: the points since the last one over HTTP. The ring lives in Redis too: while
      // it answers 503, ask less and less often (5 s doubling to 60 s).
      if (!loaded || polling || Date.now() < nextPollAt) return;
      polling = true;
      fetchHistory().then(function () { pollFailures = 0; }, function () {
        pollFailures += 1;
        nextPollAt = Date.now() + Math.min(60000, POLL_MS * Math.pow(2, pollFailures - 1));
      }).then(function () { polling = false; });
    });
    window.addEventListener("resize", function () {
      var width = Math.max(280, grid.clientWidth / (grid.clientWidth > 700 ? 2 : 1) - 16);
      charts.forEach(function (c) { c.setSize({ width: width, height: 180 }); });
    });
  }

  // --- operators: the cluster heat map and a node's GPUs ----------------------------------------
  function initHeatmap(box) {
    var canvas = box.querySelector("canvas");
    var tip = box.querySelector("[data-heat-tip]");
    var metricSel = box.querySelector("select");
    var hosts = Array.prototype.map.call(document.querySelectorAll("[data-host]"), function (a) { return a.dataset.host; });
    var perNode = Number(box.dataset.gpusPerNode) || 8;
    var cell = 6, gap = 3, nodesPerRow = 16, latest = {};
    var nodeW = perNode * cell + gap;
    canvas.width = nodesPerRow * nodeW;
    canvas.height = Math.ceil(Math.max(hosts.length, 1) / nodesPerRow) * (cell * 2 + gap);
    function value(g) {
      var m = metricSel ? metricSel.value : "util";
      if (!g) return null;
      if (m === "temp") return g[2] === null ? null : (g[2] - 25) * 100 / 65;
      if (m === "power") return g[3] === null ? null : Math.min(100, g[3] / 7);
      return g[1];
    }
    function draw() {
      var ctx = canvas.getContext("2d");
      ctx.clearRect(0, 0, canvas.width, canvas.height);
      var sampled = 0;
      hosts.forEach(function (h, i) {
        var x0 = (i % nodesPerRow) * nodeW, y0 = Math.floor(i / nodesPerRow) * (cell * 2 + gap);
        var gpus = latest[h] || {};
        for (var g = 0; g < perNode; g++) {
          if (gpus[g]) sampled++;
          ctx.fillStyle = heatColour(value(gpus[g]));
          ctx.fillRect(x0 + g * cell, y0, cell - 1, cell * 2 - 1);
        }
      });
      box.dataset.sampledGpus = String(sampled);
    }
    function apply(nodes) {
      Object.keys(nodes).forEach(function (h) {
        var gpus = {};
        nodes[h].forEach(function (g) { gpus[g[0]] = g; });
        latest[h] = gpus;
      });
    }
    canvas.addEventListener("mousemove", function (e) {
      var r = canvas.getBoundingClientRect();
      var x = (e.clientX - r.left) * canvas.width / r.width, y = (e.clientY - r.top) * canvas.height / r.height;
      var i = Math.floor(y / (cell * 2 + gap)) * nodesPerRow + Math.floor(x / nodeW);
      var g = Math.floor((x % nodeW) / cell);
      var h = hosts[i], s = h && latest[h] && latest[h][g];
      tip.textContent = h ? h + " GPU " + g + (s ? ": " + s[1] + " % · " + s[2] + " °C · " + Math.round(s[3]) + " W" : " —") : "";
    });
    if (metricSel) metricSel.addEventListener("change", draw);
    var status = box.querySelector("[data-telemetry-status]");
    function loadFrame() {
      return fetch(box.dataset.frameUrl, { credentials: "same-origin" })
        .then(function (r) { if (!r.ok) throw new Error(r.status); return r.json(); })
        .then(function (f) { latest = {}; apply(f.nodes || {}); draw(); })
        .catch(function () {});
    }
    loadFrame();
    var pending = false;
    follow(box.dataset.ws, function (payload) {
      // Hosts no longer sampled (an instance released) fade to grey.
      latest = {};
      apply(heatNodes(payload));
      if (!pending) { pending = true; requestAnimationFrame(function () { pending = false; draw(); }); }
    }, function () {}, function (s) { if (status) { status.dataset.status = s; status.textContent = box.dataset["status" + s.charAt(0).toUpperCase() + s.slice(1)] || s; } }, loadFrame);
    draw();
  }

  function initNodeGpus(box) {
    var host = box.dataset.host;
    var tbody = box.querySelector("tbody");
    follow(box.dataset.ws, function (payload) {
      var gpus = heatNodes(payload)[host];
      if (!gpus) return;
      tbody.replaceChildren();
      gpus.sort(function (a, b) { return a[0] - b[0]; }).forEach(function (g) {
        var tr = document.createElement("tr");
        var bar = document.createElement("td");
        var b = document.createElement("div");
        b.className = "rounded-1";
        b.style.height = "10px";
        b.style.width = Math.max(2, g[1] || 0) + "%";
        b.style.background = heatColour(g[1]);
        bar.appendChild(b);
        [String(g[0]), (g[1] === null ? "—" : g[1] + " %")].forEach(function (c) { tr.appendChild(text(document.createElement("td"), c)); });
        tr.appendChild(bar);
        [(g[4] === null ? "—" : (g[4] / 1024).toFixed(1) + " GiB"), (g[2] === null ? "—" : g[2] + " °C"), (g[3] === null ? "—" : Math.round(g[3]) + " W")]
          .forEach(function (c) { tr.appendChild(text(document.createElement("td"), c)); });
        tbody.appendChild(tr);
      });
      box.hidden = false;
    }, function () {}, function () {});
  }

  // The instance page's card may also appear later, when the instance starts running while the
  // page is open (instance.js fetches it and says "instance:parts"): set it up once.
  function initInstanceCard() {
    var card = document.getElementById("gpu-telemetry");
    if (!card || card.dataset.ready || !window.uPlot) return;
    card.dataset.ready = "1";
    initInstance(card);
  }
  document.addEventListener("instance:parts", initInstanceCard);
  document.addEventListener("htmx:afterSettle", initInstanceCard);
  document.addEventListener("DOMContentLoaded", function () {
    initInstanceCard();
    var heat = document.getElementById("gpu-heatmap");
    if (heat) initHeatmap(heat);
    var node = document.getElementById("node-gpus-live");
    if (node) initNodeGpus(node);
  });
})();
