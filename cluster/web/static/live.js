// The live page: polls api/state (the run's live.json plus what the server keeps) and redraws itself.
"use strict";
(function () {
  const POLL_MS = 1000;
  const LIMIT_COLORS = ["#ea580c", "#0891b2", "#65a30d", "#db2777", "#4f46e5", "#a16207"];
  const charts = {};
  const $ = (id) => document.getElementById(id);

  function text(id, value) { $(id).textContent = value; }

  function age(seconds) {
    if (seconds === null || seconds === undefined) return "-";
    seconds = Math.max(seconds, 0);
    if (seconds < 10) return seconds.toFixed(1) + "s";
    if (seconds < 60) return Math.round(seconds) + "s";
    if (seconds < 3600) return Math.floor(seconds / 60) + "m" + String(Math.round(seconds % 60)).padStart(2, "0") + "s";
    return Math.floor(seconds / 3600) + "h" + String(Math.floor(seconds % 3600 / 60)).padStart(2, "0") + "m";
  }

  function rate(perSecond) {
    if (!perSecond) return "0/s";
    return perSecond < 0.1 ? (perSecond * 60).toFixed(1) + "/min" : perSecond.toFixed(2) + "/s";
  }

  function fillRows(tbody, rows) {
    tbody.replaceChildren(...rows.map((cells) => {
      const tr = document.createElement("tr");
      for (const cell of cells.cells || cells) {
        const td = document.createElement("td");
        if (cell && typeof cell === "object") { td.textContent = cell.text; td.className = cell.cls || ""; }
        else td.textContent = cell;
        tr.appendChild(td);
      }
      if (cells.cls) tr.className = cells.cls;
      if (cells.task) tr.dataset.task = cells.task;
      return tr;
    }));
  }

  function chart(id, series, data) {
    const box = $(id);
    box.dataset.points = String(data[0].length);
    if (charts[id] && charts[id].series.length !== series.length + 1) {  // a node joined: one more line
      charts[id].destroy();
      delete charts[id];
    }
    if (!charts[id]) {
      const opts = {
        width: Math.max(box.clientWidth - 4, 320), height: 230,
        scales: { x: { time: true } },
        series: [{}].concat(series.map((s) => Object.assign(
          { label: s.label, stroke: s.color, width: 2, scale: s.scale, points: { show: false },
            value: (u, v) => v === null ? "-" : v.toFixed(s.digits) }, s.paths ? { paths: s.paths } : {}))),
        axes: [{}].concat(series.filter((s, i) => series.findIndex((t) => t.scale === s.scale) === i)
          .map((s, i) => ({ scale: s.scale, side: i === 0 ? 3 : 1, label: s.axis || s.label,
                            grid: { show: i === 0 } }))),
      };
      charts[id] = new uPlot(opts, data, box);
    } else {
      charts[id].setData(data);
    }
  }

  function render(s) {
    text("run-id", s.run_id);
    const state = $("state");
    state.textContent = s.state.toUpperCase();
    state.className = "state " + s.state;
    text("why", s.why || "");
    text("done", s.done);
    text("total", s.total);
    $("bar-fill").style.width = (s.total ? 100 * s.done / s.total : 0) + "%";
    text("progress-line", s.progress_line || "");
    text("rate", rate(s.rate));
    text("eta", s.state === "running" ? (s.eta_seconds === null ? "?" : age(s.eta_seconds)) : "-");
    text("in-flight-count", s.in_flight.length);
    text("queued", s.queued ? "+" + s.queued + " waiting for a slot" : "");
    text("reward-mean", s.reward_mean === null ? "-" : s.reward_mean.toFixed(3));
    text("scored", s.scored + " scored");

    fillRows($("in-flight").tBodies[0], s.in_flight.map((r) => ({
      task: r.task_id, cls: r.stalled ? "stalled" : "",
      cells: [r.task_id, r.sample_index, r.attempt, r.step, { text: r.last_command || "-", cls: "cmd" },
              age(r.elapsed), age(r.idle), r.node, { text: r.stalled ? "STALLED" : "", cls: "stalled-text" }],
    })));
    $("in-flight-empty").style.display = s.in_flight.length ? "none" : "";
    text("stalled-note", s.stalled ? s.stalled + " stalled (no progress for " + s.stall_seconds + "s or more)" : "");
    fillRows($("outcomes").tBodies[0], Object.entries(s.outcomes).map(([k, v]) => [k, v])
      .concat([["infra_failed", s.infra_failed]]));
    fillRows($("failures").tBodies[0], s.failures.length
      ? s.failures.map((f) => [f.type, f.count, { text: f.first_message, cls: "cmd" }]) : [["none", "", ""]]);
    fillRows($("nodes").tBodies[0], s.nodes.map((n) => [n.node, n.in_use, n.workers,
                                                        n.limit === null ? "-" : n.limit + " of " + n.capacity]));

    const h = s.history;
    chart("chart-throughput", [{ label: "done", color: "#2563eb", scale: "n", digits: 0 },
                               { label: "per minute", color: "#16a34a", scale: "r", digits: 1 }],
          [h.t, h.done, h.per_minute]);
    chart("chart-reward", [{ label: "reward mean", color: "#9333ea", scale: "w", digits: 3 }], [h.t, h.reward_mean]);
    const limits = s.limits;  // farm.adaptive: each node's limit, a step line per node
    $("limits-box").hidden = !limits.nodes.length;
    if (limits.nodes.length) {
      chart("chart-limits", limits.nodes.map((n, i) => ({
        label: "node " + n.node.slice(0, 8), color: LIMIT_COLORS[i % LIMIT_COLORS.length], scale: "l", digits: 0,
        axis: "rollouts at once", paths: uPlot.paths.stepped({ align: 1 }) })),
        [limits.t].concat(limits.nodes.map((n) => n.limit)));
    }
    text("run-dir", s.run_dir);
    text("updated", new Date(s.now * 1000).toLocaleTimeString());
    document.body.dataset.updatedAt = String(s.updated_at);
  }

  async function poll() {
    try {
      const reply = await fetch("api/state" + window.location.search, { cache: "no-store" });
      if (!reply.ok) throw new Error("the server answered " + reply.status + ": " + (await reply.text()));
      render(await reply.json());
      text("error", "");
    } catch (err) {
      text("error", String(err.message || err));
    }
    setTimeout(poll, POLL_MS);
  }

  poll();
})();
