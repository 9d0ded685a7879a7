// The web terminal on the instance page (templates/slices/_instance_terminal.html): xterm.js
// (vendored) over the terminal websocket (slices.consumers.TerminalConsumer). Binary frames carry
// the terminal's bytes both ways; JSON text frames carry the resize (browser → console) and the
// "ready" and "exit" notices (console → browser). Copy: select, then Ctrl+Shift+C or right-click;
// paste: Ctrl+Shift+V or right-click.
(function () {
  "use strict";
  // Run at load, and again when the instance page fetched its running parts (it started running
  // while open: "instance:parts"); each card is set up once.
  function setUp() {
    var card = document.getElementById("instance-terminal");
    if (!card || card.dataset.ready || typeof Terminal === "undefined" || typeof FitAddon === "undefined") return;
    card.dataset.ready = "1";

    // Monospace first, then CJK fonts people have (Chinese output keeps its glyphs, two cells wide).
    var FONT = '"Cascadia Mono", "DejaVu Sans Mono", Menlo, Consolas, "Liberation Mono", ' +
      '"Noto Sans Mono CJK SC", "Sarasa Mono SC", "PingFang SC", "Microsoft YaHei", ' +
      '"Noto Sans CJK SC", "WenQuanYi Micro Hei", monospace';
    var CHUNK = 16384; // keystroke frames stay well under the console's 64 KiB frame limit
    var CLOSE_TEXT = {
      4401: "unauthenticated", 4404: "not-found", 4408: "idle", 4409: "not-running",
      4429: "too-many", 4503: "unavailable"
    };

    var screen = card.querySelector("[data-terminal-screen]");
    var openButton = card.querySelector("[data-terminal-open]");
    var closeButton = card.querySelector("[data-terminal-close]");
    var statusLine = card.querySelector("[data-terminal-status]");
    var help = card.querySelector("[data-terminal-help]");
    var rankSelect = card.querySelector("[data-terminal-rank]");
    var encoder = new TextEncoder();
    var term = null;
    var fit = null;
    var ws = null;
    var ready = false;
    var exitNotice = null;
    var resizeTimer = null;

    function message(name) {
      return card.getAttribute("data-msg-" + name) || "";
    }

    function setStatus(text) {
      statusLine.textContent = text;
    }

    function wsUrl(path) {
      return (location.protocol === "https:" ? "wss://" : "ws://") + location.host + path;
    }

    function send(data) {
      if (!ws || !ready || ws.readyState !== WebSocket.OPEN) return;
      var bytes = encoder.encode(data);
      for (var i = 0; i < bytes.length; i += CHUNK) ws.send(bytes.subarray(i, i + CHUNK));
    }

    function sendResize() {
      if (!ws || !ready || ws.readyState !== WebSocket.OPEN || !term) return;
      ws.send(JSON.stringify({ type: "resize", cols: term.cols, rows: term.rows }));
    }

    function copySelection() {
      if (!term || !term.hasSelection()) return false;
      var text = term.getSelection();
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(text).then(function () { setStatus(message("copied")); });
      } else {
        var area = document.createElement("textarea");
        area.value = text;
        area.setAttribute("readonly", "");
        area.style.position = "fixed";
        area.style.opacity = "0";
        document.body.appendChild(area);
        area.select();
        try { document.execCommand("copy"); setStatus(message("copied")); } catch (e) { /* none */ }
        document.body.removeChild(area);
        term.focus();
      }
      return true;
    }

    function keys(event) {
      if (event.type !== "keydown" || !event.ctrlKey || !event.shiftKey) return true;
      if (event.code === "KeyC") {
        copySelection();
        event.preventDefault();
        return false;
      }
      if (event.code === "KeyV") return false; // the browser pastes into xterm's textarea
      return true;
    }

    function rightClick(event) {
      if (!term) return;
      if (copySelection()) {
        term.clearSelection();
        event.preventDefault();
      } else if (navigator.clipboard && navigator.clipboard.readText && window.isSecureContext) {
        event.preventDefault();
        navigator.clipboard.readText().then(function (text) { if (text) term.paste(text); });
      }
    }

    function makeTerminal() {
      term = new Terminal({
        fontFamily: FONT,
        fontSize: 14,
        cursorBlink: true,
        scrollback: 5000,
        theme: { background: "#1e1e1e" }
      });
      fit = new FitAddon.FitAddon();
      term.loadAddon(fit);
      term.open(screen);
      screen.xterm = term; // what the terminal holds, for the browser tests and for debugging
      term.onData(send);
      term.onBinary(function (data) { // bytes 0-255 as a string (mouse reports in X10 mode)
        var bytes = new Uint8Array(data.length);
        for (var i = 0; i < data.length; i++) bytes[i] = data.charCodeAt(i) & 255;
        if (ws && ready && ws.readyState === WebSocket.OPEN) ws.send(bytes);
      });
      term.onResize(sendResize);
      term.attachCustomKeyEventHandler(keys);
      screen.addEventListener("contextmenu", rightClick);
      window.addEventListener("resize", function () {
        clearTimeout(resizeTimer);
        resizeTimer = setTimeout(function () { if (!screen.hidden) fit.fit(); }, 100);
      });
    }

    function closedText(code) {
      if (exitNotice && exitNotice.reason === "idle") {
        return message("idle").replace("%(minutes)s", String(Math.round((exitNotice.idle_seconds || 0) / 60)));
      }
      if (exitNotice && exitNotice.reason) return message(exitNotice.reason.replace(/_/g, "-")) || message("closed");
      return message(CLOSE_TEXT[code] || "closed");
    }

    function open() {
      if (ws) return;
      screen.hidden = false;
      help.hidden = false;
      if (!term) makeTerminal();
      else term.reset();
      fit.fit();
      ready = false;
      exitNotice = null;
      var rank = rankSelect ? rankSelect.value : "0";
      var query = "?rank=" + encodeURIComponent(rank) + "&cols=" + term.cols + "&rows=" + term.rows;
      ws = new WebSocket(wsUrl(card.getAttribute("data-ws")) + query);
      ws.binaryType = "arraybuffer";
      setStatus(message("connecting"));
      openButton.hidden = true;
      closeButton.hidden = false;
      if (rankSelect) rankSelect.disabled = true;
      ws.onmessage = function (event) {
        if (typeof event.data !== "string") {
          term.write(new Uint8Array(event.data)); // xterm decodes UTF-8 across frames
          return;
        }
        var notice;
        try { notice = JSON.parse(event.data); } catch (e) { return; }
        if (notice.type === "ready") {
          ready = true;
          setStatus(message("connected") + " · #" + notice.rank + " " + notice.node);
          card.setAttribute("data-terminal-ready", "1");
          sendResize();
          term.focus();
        } else if (notice.type === "exit") {
          exitNotice = notice;
        }
      };
      ws.onclose = function (event) {
        ws = null;
        ready = false;
        card.removeAttribute("data-terminal-ready");
        setStatus(closedText(event.code));
        openButton.hidden = false;
        closeButton.hidden = true;
        if (rankSelect) rankSelect.disabled = false;
      };
    }

    openButton.addEventListener("click", open);
    closeButton.addEventListener("click", function () { if (ws) ws.close(1000); });
    window.addEventListener("pagehide", function () { if (ws) ws.close(1000); });
  }
  setUp();
  document.addEventListener("instance:parts", setUp);
  document.addEventListener("htmx:afterSettle", setUp);
})();
