// Traffic: GET /metrics (the same counters operators scrape), parsed in the page and polled
// while shown: per instance requests, completion tokens/s over the last minute of polls, first-byte latency
// percentiles of /v1/chat/completions (for a streamed answer the time to its first byte,
// docs/operations.md, "Metrics") and the prompt-cache hit ratio.

import { metricsText } from "./api.js";
import { parseMetrics, quantile, sum } from "./metrics.js";
import { fill, h, num, say } from "./util.js";

const CHAT_ROUTE = "/v1/chat/completions";
const LATENCY = "werk_http_request_duration_seconds";
const RATE_WINDOW_MS = 60 * 1000;

export class TrafficView {
  constructor(root) {
    this.status = h("p", { class: "status", role: "status" });
    this.table = h("div", { id: "traffic-table" });
    this.routes = h("div", { id: "traffic-routes" });
    fill(root, h("h2", {}, "Traffic"), this.status, this.table, h("h3", {}, "Requests by route"), this.routes);
    this.history = [];
  }

  async refresh() {
    let samples;
    try {
      samples = parseMetrics(await metricsText());
    } catch (err) {
      say(this.status, `Could not read /metrics: ${err.message}`, true);
      return;
    }
    const now = Date.now();
    const instances = new Set();
    for (const s of samples) if (s.name.startsWith("werk_chat_") && s.labels.instance) instances.add(s.labels.instance);
    const completion = Object.fromEntries([...instances].map((i) => [i, sum(samples, "werk_chat_completion_tokens_total", { instance: i })]));
    this.history.push({ t: now, completion });
    while (this.history.length > 2 && this.history[0].t < now - RATE_WINDOW_MS) this.history.shift();
    const oldest = this.history[0];
    const rows = [...instances].sort().map((i) => {
      let rate = null;
      if (oldest.t < now && oldest.completion[i] !== undefined) rate = (completion[i] - oldest.completion[i]) / ((now - oldest.t) / 1000);
      const hits = sum(samples, "werk_chat_prompt_cache_hits_total", { instance: i });
      const misses = sum(samples, "werk_chat_prompt_cache_misses_total", { instance: i });
      const p = (q) => quantile(samples, LATENCY, { instance: i, route: CHAT_ROUTE }, q);
      const ms = (v) => (v === null ? "—" : `${num(v * 1000)} ms`);
      return h(
        "tr",
        { "data-instance": i },
        h("td", {}, i),
        h("td", { class: "num" }, sum(samples, "werk_chat_requests_total", { instance: i })),
        h("td", { class: "num" }, sum(samples, "werk_chat_requests_active", { instance: i })),
        h("td", { class: "num" }, sum(samples, "werk_chat_requests_failed_total", { instance: i })),
        h("td", { class: "num" }, sum(samples, "werk_chat_prompt_tokens_total", { instance: i })),
        h("td", { class: "num" }, completion[i]),
        h("td", { class: "num" }, rate === null ? "—" : num(rate, 1)),
        h("td", { class: "num" }, ms(p(0.5))),
        h("td", { class: "num" }, ms(p(0.95))),
        h("td", { class: "num" }, hits + misses ? `${num((100 * hits) / (hits + misses))} % of ${hits + misses}` : "—"),
      );
    });
    say(this.status, `${instances.size} instance(s) with chat traffic; tokens/s: completion tokens over the last minute of polls.`);
    const head = ["Instance", "Requests", "Active", "Failed", "Prompt tokens", "Completion tokens", "Tokens/s", "First byte p50", "First byte p95", "Prompt-cache hits"];
    fill(
      this.table,
      rows.length
        ? h("table", {}, h("thead", {}, h("tr", {}, head.map((t) => h("th", {}, t)))), h("tbody", {}, rows))
        : h("p", { class: "muted" }, "No chat requests yet."),
    );
    const byRoute = new Map();
    for (const s of samples) {
      if (s.name !== "werk_http_requests_total") continue;
      const key = `${s.labels.method} ${s.labels.route} ${s.labels.status}`;
      byRoute.set(key, (byRoute.get(key) || 0) + s.value);
    }
    const routeRows = [...byRoute.entries()].sort((a, b) => b[1] - a[1]).map(([k, v]) => h("tr", {}, h("td", { class: "mono" }, k), h("td", { class: "num" }, v)));
    fill(this.routes, h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "Method, route, status"), h("th", {}, "Requests"))), h("tbody", {}, routeRows)));
  }
}
