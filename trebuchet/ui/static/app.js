// treb ui: charts (uPlot, vendored beside this file) and the live log view.
// Data comes from <script type="application/json"> blocks; text is set with textContent only.
"use strict";
(function () {
  function json(id) {
    var el = document.getElementById(id);
    return el ? JSON.parse(el.textContent) : null;
  }
  function width(el) { return Math.max(320, Math.min(900, el.clientWidth || 640)); }
  // An axis as wide as its longest label (uPlot's default is a fixed 50 px, which cut
  // 16,050 to "6,050"): measured with the axis's own font, plus its ticks and gap.
  function axisSize(self, values, axisIdx, cycleNum) {
    var axis = self.axes[axisIdx];
    if (cycleNum > 1 && axis._size) { return axis._size; }
    var longest = 0;
    var font = axis.font && axis.font[0];
    if (font) { self.ctx.font = font; }
    (values || []).forEach(function (v) {
      if (v != null) { longest = Math.max(longest, self.ctx.measureText(String(v)).width); }
    });
    var ticks = (axis.ticks && axis.ticks.show !== false) ? (axis.ticks.size || 10) : 0;
    return Math.ceil(longest / (window.devicePixelRatio || 1) + ticks + (axis.gap || 5) + 8);
  }

  function lineChart(parent, title, xs, ys, opts) {
    var box = document.createElement("div");
    box.className = "chart";
    box.setAttribute("data-name", title);
    parent.appendChild(box);
    var scatter = opts && opts.scatter;
    var series = {label: opts && opts.ylabel || title, stroke: "#2463eb", width: 2,
                  points: {show: scatter || xs.length < 60, size: scatter ? 8 : 5}};
    if (scatter) { series.paths = function () { return null; }; }
    new uPlot({
      title: title, width: width(parent), height: 240,
      scales: {x: {time: !!(opts && opts.time)}},
      axes: [{label: opts && opts.xlabel || "step"}, {size: axisSize}],
      series: [{label: opts && opts.xlabel || "step"}, series]
    }, [xs, ys], box);
  }

  var metrics = json("metrics-data");
  if (metrics) {
    var mbox = document.getElementById("metric-charts");
    Object.keys(metrics).sort().forEach(function (name) {
      lineChart(mbox, name, metrics[name].x, metrics[name].y, {});
    });
  }
  var sweep = json("sweep-data");
  if (sweep) {
    lineChart(document.getElementById("sweep-chart"), sweep.ylabel + " against " + sweep.xlabel,
              sweep.x, sweep.y, {scatter: true, xlabel: sweep.xlabel, ylabel: sweep.ylabel});
  }
  var trend = json("trend-data");
  if (trend) {
    var tbox = document.getElementById("trend-charts");
    Object.keys(trend).sort().forEach(function (name) {
      lineChart(tbox, name, trend[name].x, trend[name].y, {time: true, xlabel: "created"});
    });
  }

  var logs = document.getElementById("logs");
  var pick = document.getElementById("log-pick");
  if (logs && pick) {
    var pre = document.getElementById("log");
    var status = document.getElementById("log-status");
    var source = null;
    var MAX_LINES = 5000;
    var add = function (text, cls) {
      var line = document.createElement("span");
      if (cls) { line.className = cls; }
      line.textContent = text + "\n";
      pre.appendChild(line);
      while (pre.childNodes.length > MAX_LINES) { pre.removeChild(pre.firstChild); }
      pre.scrollTop = pre.scrollHeight;
    };
    var live = logs.getAttribute("data-active") === "1";  // an ended run's log is read, not followed
    var open = function () {
      if (source) { source.close(); }
      pre.textContent = "";
      status.textContent = live ? "following" : "reading the log of the ended run";
      status.setAttribute("data-state", live ? "following" : "reading");
      var url = "/runs/" + encodeURIComponent(logs.getAttribute("data-run")) +
                "/logs?log=" + encodeURIComponent(pick.value);
      source = new EventSource(url);
      source.addEventListener("line", function (ev) { add(JSON.parse(ev.data)); });
      source.addEventListener("note", function (ev) { add(JSON.parse(ev.data), "note"); });
      source.addEventListener("end", function (ev) {
        status.textContent = JSON.parse(ev.data);
        status.setAttribute("data-state", "ended");
        source.close();
      });
      source.onerror = function () {
        if (status.getAttribute("data-state") !== "ended") { status.textContent = "reconnecting"; }
      };
    };
    pick.addEventListener("change", open);
    open();
  }
})();
