// Memory: GET /werk/v1/memory, sampled every few seconds from sign-in on (whatever view is
// shown) and kept for the last minutes, drawn as an SVG line chart by this module's own code.

import { call } from "./api.js";
import { bytes, fill, h, say, svg } from "./util.js";

const KEEP_MS = 5 * 60 * 1000;
const WIDTH = 640;
const HEIGHT = 200;
const PAD = 8;
const LEFT = 72;
const BOTTOM = 22;
const MIN_SPAN_MS = 10 * 1000;
const SERIES = [
  { name: "host used", cls: "line-host", pick: (r) => used(r.host) },
  { name: "host managed", cls: "line-managed", pick: (r) => r.host.managed_bytes },
  { name: "accelerator used", cls: "line-accel", pick: (r) => used(r.accelerator) },
];

function used(tier) {
  if (tier.capacity_bytes === null || tier.available_bytes === null) return null;
  return tier.capacity_bytes - tier.available_bytes;
}

export class MemoryHistory {
  constructor() {
    this.samples = [];
    this.listeners = new Set();
  }

  async sample() {
    const report = await call("GET", "/werk/v1/memory");
    const now = Date.now();
    this.samples.push({ t: now, report });
    while (this.samples.length && this.samples[0].t < now - KEEP_MS) this.samples.shift();
    for (const listener of this.listeners) listener();
    return report;
  }

  latest() {
    return this.samples.length ? this.samples[this.samples.length - 1].report : null;
  }
}

/** The chart of the history's samples: one polyline per series with values. */
export function chart(samples) {
  const root = svg("svg", { viewBox: `0 0 ${WIDTH} ${HEIGHT}`, class: "chart", role: "img", "aria-label": "memory over the last minutes" });
  root.append(svg("rect", { x: 0, y: 0, width: WIDTH, height: HEIGHT, class: "chart-bg" }));
  if (!samples.length) return root;
  let top = 0;
  for (const s of samples) {
    const cap = s.report.host.capacity_bytes;
    if (cap !== null) top = Math.max(top, cap);
    for (const series of SERIES) top = Math.max(top, series.pick(s.report) ?? 0);
  }
  if (top <= 0) top = 1;
  const now = samples[samples.length - 1].t;
  // the time axis spans the samples kept (at least 10 s, at most KEEP_MS), ending now
  const span = Math.min(KEEP_MS, Math.max(MIN_SPAN_MS, now - samples[0].t));
  const x = (t) => LEFT + ((WIDTH - LEFT - PAD) * (t - (now - span))) / span;
  const y = (v) => HEIGHT - BOTTOM - ((HEIGHT - BOTTOM - PAD) * v) / top;
  for (let i = 0; i <= 4; i += 1) {
    const value = (top * i) / 4;
    root.append(svg("line", { x1: LEFT, x2: WIDTH - PAD, y1: y(value), y2: y(value), class: "grid" }));
    root.append(svg("text", { x: LEFT - 4, y: y(value) + 4, class: "chart-label chart-y" }, bytes(value)));
  }
  root.append(svg("text", { x: LEFT, y: HEIGHT - 6, class: "chart-label" }, `−${Math.round(span / 1000)} s`));
  root.append(svg("text", { x: WIDTH - PAD, y: HEIGHT - 6, class: "chart-label chart-y" }, "now"));
  for (const series of SERIES) {
    const points = samples
      .map((s) => [s.t, series.pick(s.report)])
      .filter(([, v]) => v !== null && v !== undefined)
      .map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`);
    if (points.length > 1) root.append(svg("polyline", { points: points.join(" "), class: `line ${series.cls}` }, svg("title", {}, series.name)));
    const [cx, cy] = points.length ? points[points.length - 1].split(",") : [];
    if (points.length) root.append(svg("circle", { cx, cy, r: 3, class: `dot ${series.cls}` }));
  }
  return root;
}

export class MemoryView {
  constructor(root, ctx) {
    this.history = ctx.memory;
    this.status = h("p", { class: "status", role: "status" });
    this.legend = h("p", { class: "legend" }, SERIES.map((s) => h("span", { class: `key ${s.cls}` }, s.name)));
    this.chart = h("div", { id: "memory-chart" });
    this.table = h("div", { id: "memory-table" });
    fill(root, h("h2", {}, "Memory"), this.status, this.chart, this.legend, this.table);
    this.draw = () => this.render();
    this.history.listeners.add(this.draw);
  }

  async refresh() {
    if (!this.history.latest()) {
      try {
        await this.history.sample();
      } catch (err) {
        say(this.status, `Could not read memory: ${err.message}`, true);
        return;
      }
    }
    this.render();
  }

  stop() {
    this.history.listeners.delete(this.draw);
  }

  render() {
    const report = this.history.latest();
    if (!report) return;
    say(this.status, `Overall pressure: ${report.overall_pressure} · topology: ${report.topology} · ${this.history.samples.length} samples`);
    fill(this.chart, chart(this.history.samples));
    const row = (name, tier) =>
      h(
        "tr",
        {},
        h("td", {}, name),
        h("td", { class: "num" }, bytes(tier.capacity_bytes)),
        h("td", { class: "num" }, bytes(tier.available_bytes)),
        h("td", { class: "num" }, bytes(tier.managed_bytes)),
        h("td", { class: "num" }, bytes(tier.reserved_bytes)),
        h("td", {}, h("span", { class: `pressure pressure-${tier.pressure}` }, tier.pressure)),
      );
    const counters = Object.entries(report.counters).map(([k, v]) => h("tr", {}, h("td", {}, k.replaceAll("_", " ")), h("td", { class: "num" }, v)));
    fill(
      this.table,
      h(
        "table",
        {},
        h("thead", {}, h("tr", {}, ["Tier", "Capacity", "Available", "Managed", "Reserved", "Pressure"].map((t) => h("th", {}, t)))),
        h("tbody", {}, row("host", report.host), row("accelerator", report.accelerator)),
      ),
      h("h3", {}, "Counters"),
      h("table", { class: "counters" }, h("tbody", {}, counters)),
    );
  }
}
