// The ESync dashboard: polls the job's JSON every few seconds and redraws the table and charts.
// Plain DOM and SVG, no library, nothing from outside this server. Every text from the server
// goes in through textContent (never innerHTML).
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                 "#7f7f7f", "#bcbd22", "#17becf"];
const body = document.body;
const state = { job: body.dataset.job, timer: null };

function colour(rank) { return COLOURS[rank % COLOURS.length]; }

function text(id, value) { document.getElementById(id).textContent = value; }

function fmt(value, digits) {
  return value === null || value === undefined ? "–" : Number(value).toFixed(digits);
}

function el(tag, attrs, content) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  if (content !== undefined) node.textContent = content;
  return node;
}

function svgEl(tag, attrs, content) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  if (content !== undefined) node.textContent = content;
  return node;
}

async function getJSON(url) {
  const response = await fetch(url, { cache: "no-store" });
  const data = await response.json();
  if (!response.ok) throw new Error(data.error || `HTTP ${response.status}`);
  return data;
}

function jobUrl(job) {
  return body.dataset.jobUrl.replace("/JOB/", "/" + encodeURIComponent(job) + "/");
}

// -- the job chooser ----------------------------------------------------------------------------
async function refreshJobs() {
  const select = document.getElementById("job");
  const jobs = (await getJSON(body.dataset.jobsUrl)).jobs;
  const known = new Set(Array.from(select.options, (o) => o.value));
  if (!state.job && jobs.length) state.job = jobs[0].name;
  for (const job of jobs) {
    if (!known.has(job.name)) select.appendChild(el("option", { value: job.name }, job.name));
  }
  for (const option of Array.from(select.options)) {
    if (option.value === "" && jobs.length) option.remove();
  }
  select.value = state.job;
}

document.getElementById("job").addEventListener("change", (event) => {
  state.job = event.target.value;
  const url = new URL(window.location.href);
  url.searchParams.set("job", state.job);
  window.history.replaceState(null, "", url);
  tick();
});

// -- the worker table ---------------------------------------------------------------------------
// The device's slow-down factor in force, as the worker last said ("x6": six times slower).
function speed(slowdown) {
  return slowdown === null || slowdown === undefined ? "–" : `x${+Number(slowdown).toFixed(2)}`;
}

function workerRow(w) {
  const row = el("tr", { class: "worker", "data-rank": w.rank });
  if (w.slowest) row.classList.add("is-slowest");
  const rank = el("td", { class: "rank" });
  rank.appendChild(el("span", { class: "swatch", "data-rank": w.rank }));
  rank.firstChild.style.background = colour(w.rank);
  rank.appendChild(document.createTextNode(String(w.rank)));
  row.appendChild(rank);
  row.appendChild(el("td", { class: "device" }, w.device || "–"));
  row.appendChild(el("td", { class: "host" }, w.host || "–"));
  row.appendChild(el("td", { class: "speed num" }, speed(w.slowdown)));
  row.appendChild(el("td", { class: "k num" }, w.k === null ? "–" : String(w.k)));
  row.appendChild(el("td", { class: "k-live num" }, w.k_live === null ? "–" : String(w.k_live)));
  row.appendChild(el("td", { class: "c num" }, w.c ? fmt(w.c * 1000, 1) : "–"));
  const bar = el("td", { class: "split" });
  const track = el("div", { class: "bar" });
  const compute = el("span", { class: "compute" });
  const share = w.compute_share === null ? 0 : w.compute_share;
  compute.style.width = (share * 100).toFixed(1) + "%";
  track.appendChild(compute);
  track.title = w.compute_share === null ? "no closed round yet"
    : `computing ${(share * 100).toFixed(0)}% (${fmt(w.compute, 2)} s), ` +
      `waiting ${(100 - share * 100).toFixed(0)}% (${fmt(w.wait, 2)} s) over the last rounds`;
  bar.appendChild(track);
  bar.appendChild(el("span", { class: "share" },
                     w.compute_share === null ? "–" : `${(share * 100).toFixed(0)}%`));
  row.appendChild(bar);
  row.appendChild(el("td", { class: "requests num" }, w.requests === null ? "–" : String(w.requests)));
  row.appendChild(el("td", { class: "slowest" },
                     w.slowest ? "slowest" : w.sits_out ? "sits out" : ""));
  return row;
}

function drawWorkers(workers) {
  const tbody = document.querySelector("#workers tbody");
  tbody.replaceChildren(...workers.map(workerRow));
}

// -- charts -------------------------------------------------------------------------------------
const BOX = { left: 48, right: 590, top: 12, bottom: 210 };

function scale(domain, range) {
  const [d0, d1] = domain[0] === domain[1] ? [domain[0] - 1, domain[1] + 1] : domain;
  return (v) => range[0] + ((v - d0) / (d1 - d0)) * (range[1] - range[0]);
}

function axes(svg, xDomain, yDomain, xLabel, yTicks, yFormat) {
  svg.appendChild(svgEl("line", { x1: BOX.left, y1: BOX.bottom, x2: BOX.right, y2: BOX.bottom,
                                   class: "axis" }));
  svg.appendChild(svgEl("line", { x1: BOX.left, y1: BOX.top, x2: BOX.left, y2: BOX.bottom,
                                   class: "axis" }));
  const y = scale(yDomain, [BOX.bottom, BOX.top]);
  for (const tick of yTicks) {
    svg.appendChild(svgEl("line", { x1: BOX.left, y1: y(tick), x2: BOX.right, y2: y(tick),
                                     class: "grid" }));
    svg.appendChild(svgEl("text", { x: BOX.left - 6, y: y(tick) + 4, class: "tick",
                                     "text-anchor": "end" }, yFormat(tick)));
  }
  svg.appendChild(svgEl("text", { x: BOX.left, y: BOX.bottom + 18, class: "tick" },
                        String(xDomain[0])));
  svg.appendChild(svgEl("text", { x: BOX.right, y: BOX.bottom + 18, class: "tick",
                                   "text-anchor": "end" }, String(xDomain[1])));
  svg.appendChild(svgEl("text", { x: (BOX.left + BOX.right) / 2, y: BOX.bottom + 26,
                                   class: "label", "text-anchor": "middle" }, xLabel));
}

function empty(svg, message) {
  svg.appendChild(svgEl("text", { x: 300, y: 115, class: "empty", "text-anchor": "middle" },
                        message));
}

function drawK(rounds, numWorkers) {
  const svg = document.getElementById("k-chart");
  svg.replaceChildren();
  const legend = document.getElementById("k-legend");
  legend.replaceChildren();
  for (let rank = 0; rank < numWorkers; rank++) {
    const item = el("li", {}, `rank ${rank}`);
    const swatch = el("span", { class: "swatch" });
    swatch.style.background = colour(rank);
    item.prepend(swatch);
    legend.appendChild(item);
  }
  if (!rounds.length) { empty(svg, "no closed round yet"); return; }
  const first = rounds[0].round, last = rounds[rounds.length - 1].round;
  const kMax = Math.max(1, ...rounds.flatMap((r) => r.k.filter((k) => k !== null)));
  const step = Math.max(1, Math.ceil(kMax / 5));
  const ticks = [];
  for (let t = 0; t <= kMax; t += step) ticks.push(t);
  axes(svg, [first, last], [0, kMax], "round", ticks, String);
  const x = scale([first, last], [BOX.left, BOX.right]);
  const y = scale([0, kMax], [BOX.bottom, BOX.top]);
  for (let rank = 0; rank < numWorkers; rank++) {
    const points = rounds.filter((r) => r.k[rank] !== null)
      .map((r) => `${x(r.round).toFixed(1)},${y(r.k[rank]).toFixed(1)}`);
    if (!points.length) continue;
    svg.appendChild(svgEl("polyline", { points: points.join(" "), fill: "none",
                                         stroke: colour(rank), "stroke-width": 2,
                                         class: "series", "data-rank": rank }));
  }
}

function drawAccuracy(scores) {
  const svg = document.getElementById("accuracy-chart");
  svg.replaceChildren();
  if (!scores.length) { empty(svg, "no score yet (the evaluator scores each checkpoint)"); return; }
  const tMax = Math.max(1e-9, ...scores.map((s) => s.time));
  const aMin = Math.max(0, Math.floor(Math.min(...scores.map((s) => s.accuracy)) * 10) / 10);
  const ticks = [];
  for (let a = aMin; a <= 1.0001; a += (1 - aMin) / 4) ticks.push(a);
  axes(svg, ["0 s", `${tMax.toFixed(1)} s`], [aMin, 1], "training time", ticks,
       (a) => a.toFixed(2));
  const x = scale([0, tMax], [BOX.left, BOX.right]);
  const y = scale([aMin, 1], [BOX.bottom, BOX.top]);
  const points = scores.map((s) => `${x(s.time).toFixed(1)},${y(s.accuracy).toFixed(1)}`);
  svg.appendChild(svgEl("polyline", { points: points.join(" "), fill: "none",
                                       class: "accuracy-line", "stroke-width": 2 }));
  for (const s of scores) {
    const dot = svgEl("circle", { cx: x(s.time), cy: y(s.accuracy), r: 3, class: "accuracy-dot" });
    dot.appendChild(svgEl("title", {}, `round ${s.round}: ${s.accuracy.toFixed(4)} at ` +
                                        `${s.time.toFixed(1)} s`));
    svg.appendChild(dot);
  }
}

// -- the loop -----------------------------------------------------------------------------------
function draw(data) {
  text("policy", data.policy);
  text("num-workers", String(data.num_workers));
  text("round", String(data.round));
  text("rate", fmt(data.rounds_per_second, 2));
  const lastScore = data.scores[data.scores.length - 1];
  text("accuracy", lastScore ? `${lastScore.accuracy.toFixed(4)} (round ${lastScore.round})` : "–");
  drawWorkers(data.workers);
  drawK(data.recent_rounds, data.num_workers);
  drawAccuracy(data.scores);
  text("status", `Job ${data.job}, run ${data.run}: updated ${new Date().toLocaleTimeString()}`);
  document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
}

async function tick() {
  clearTimeout(state.timer);
  try {
    await refreshJobs();
    if (state.job) {
      text("data-url", jobUrl(state.job));
      draw(await getJSON(jobUrl(state.job)));
    }
  } catch (error) {
    text("status", `Cannot refresh: ${error.message} (retrying)`);
  } finally {
    state.timer = setTimeout(tick, Number(body.dataset.refreshMs) || 2000);
  }
}

tick();
