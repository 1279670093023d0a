// report.html's charts: drawn with uPlot (inlined beside this) from the JSON in <script id="report-data">.
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("report-data").textContent);
  const bars = uPlot.paths.bars;
  let drawn = 0;

  function none(box, why) {
    const div = document.createElement("div");
    div.className = "none";
    div.textContent = why;
    box.appendChild(div);
  }

  const WHOLE = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000];

  function plot(box, xs, series, xAxis, ready) {
    const opts = {
      hooks: ready ? { ready: [ready] } : {},
      width: Math.max(box.clientWidth - 4, 300), height: 240, legend: { show: series.length > 1, live: false },
      scales: { x: { time: false, auto: false, range: [xs[0] - xAxis.pad, xs[xs.length - 1] + xAxis.pad] },
                y: { range: (u, lo, hi) => [0, Math.max(hi, 1) * 1.1] } },
      series: [{ label: xAxis.label }].concat(series.map((s) => ({
        label: s.label, fill: s.color, stroke: s.color, width: 0, points: { show: false },
        paths: bars({ size: [s.size || 0.9, 200], align: 0 }) }))),
      axes: [Object.assign({ label: xAxis.label }, xAxis.axis || {}), { label: "rollouts", incrs: WHOLE }],
    };
    new uPlot(opts, [xs].concat(series.map((s) => s.values)), box);
    box.dataset.rendered = "1";
    drawn += 1;
  }

  function histogram(id, hist, label, color, whole) {
    const box = document.getElementById(id);
    if (!hist.n) return none(box, "no completed rollouts");
    const mean = hist.mean === null ? "" : ", mean " + hist.mean.toPrecision(3);
    plot(box, hist.centers, [{ label: "rollouts", values: hist.counts, color: color, size: 0.92 }],
         { label: label + " (n=" + hist.n + mean + ")", pad: hist.width / 2, axis: whole ? { incrs: WHOLE } : {} });
  }

  // Category names (task ids, instance ids, failure types) can be long: they are HTML under the bars, whole (a
  // canvas axis would cut them), each under its bar: across when it fits, else wrapped in its bar's width, else
  // (bars narrower than WRAP_PITCH) upright; the box gets the width that takes (LABEL_PITCH pixels a bar).
  const LABEL_PITCH = 20;
  const WRAP_PITCH = 120;

  function categories(id, names, series) {
    const box = document.getElementById(id);
    if (!names.length) return none(box, "none");
    const xs = names.map((_, i) => i);
    box.parentElement.style.minWidth = (names.length * LABEL_PITCH + 90) + "px";
    const axis = { splits: () => xs, values: (u, splits) => splits.map(() => ""), size: 8 };
    plot(box, xs, series, { label: "", pad: 0.6, axis: axis }, (u) => labels(box, u, names));
  }

  function labels(box, u, names) {
    const strip = document.createElement("div");
    strip.className = "category-labels";
    u.root.insertBefore(strip, u.root.querySelector(".u-legend"));  // right under the bars, above the legend
    const spans = names.map((name) => {
      const span = document.createElement("span");
      span.className = "category-label";
      span.textContent = name;
      span.title = name;
      strip.appendChild(span);
      return span;
    });
    const left = u.over.getBoundingClientRect().left - strip.getBoundingClientRect().left;
    const centers = names.map((_, i) => left + u.valToPos(i, "x"));
    const pitch = names.length > 1 ? centers[1] - centers[0] : u.over.clientWidth;
    const long = spans.some((span) => span.offsetWidth > pitch - 6);
    const upright = long && pitch < WRAP_PITCH;
    strip.classList.toggle("upright", upright);
    strip.classList.toggle("wrapped", long && !upright);
    let height = 0;
    spans.forEach((span, i) => {
      if (!upright) span.style.width = (pitch - 6) + "px";
      span.style.left = (centers[i] - span.offsetWidth / 2) + "px";
      height = Math.max(height, span.offsetHeight);
    });
    strip.style.height = (height + 4) + "px";
  }

  histogram("chart-rewards", data.rewards, "reward", "#7c3aed");
  histogram("chart-durations", data.durations, "seconds", "#2563eb");
  histogram("chart-turns", data.turns, "turns", "#0d9488", true);
  categories("chart-outcomes", Object.keys(data.outcomes),
             [{ label: "rollouts", values: Object.values(data.outcomes), color: "#16a34a" }]);
  categories("chart-failures", Object.keys(data.failures),
             [{ label: "rollouts", values: Object.values(data.failures), color: "#dc2626" }]);
  const t = data.per_task;
  categories("chart-per-task", t.tasks, [
    { label: "samples", values: t.samples, color: "#d1d5db", size: 0.9 },
    { label: data.swe ? "resolved" : "successes", values: t.wins, color: "#16a34a", size: 0.9 }]);
  document.body.dataset.charts = String(drawn);
})();
