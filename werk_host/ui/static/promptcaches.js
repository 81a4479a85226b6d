// This key's prompt-cache entries (docs/prompt-cache.md, "Routes"): GET /werk/v1/prompt-caches,
// with pin/unpin/evict (POST /werk/v1/prompt-caches/{instance}/{entry}/actions) and prune
// (POST /werk/v1/prompt-caches/prune: all, one instance, older than N minutes), each previewed
// then confirmed through preview.js. Below, per instance and all keys together, the prompt-cache
// counters and bytes of /metrics (docs/prompt-cache.md, "Visible").

import { call, metricsText } from "./api.js";
import { parseMetrics, sum } from "./metrics.js";
import { Preview, PruneForm } from "./preview.js";
import { ago, bytes, fill, h, say } from "./util.js";

const entries = (n) => `${n} entr${n === 1 ? "y" : "ies"}`;
const yesNo = (value) => (value === null || value === undefined ? "unknown" : value ? "yes" : "no");

export class PromptCachesView {
  constructor() {
    this.status = h("p", { class: "status", id: "caches-status", role: "status" });
    this.table = h("div", { id: "caches-table" });
    this.counters = h("div", { id: "caches-counters" });
    this.preview = new Preview("caches");
    const kinds = [
      { value: "older", label: "older than (minutes)" },
      { value: "instance", label: "instance", field: "instance" },
      { value: "all", label: "all of this key's entries" },
    ];
    const form = new PruneForm("caches-prune", "Prune", kinds, this.preview, (selector) => this.previewPrune(selector));
    this.el = h(
      "section",
      { id: "prompt-caches" },
      h("h2", {}, "Prompt caches of this key"),
      this.status,
      form.el,
      this.preview.el,
      this.table,
      h("h3", {}, "Per instance, all keys together (/metrics)"),
      this.counters,
    );
  }

  async refresh() {
    await this.refreshEntries();
    await this.refreshCounters();
  }

  async refreshEntries() {
    let data;
    try {
      data = await call("GET", "/werk/v1/prompt-caches");
    } catch (err) {
      say(this.status, `Could not list prompt caches: ${err.message}`, true);
      return;
    }
    const n = data.entries.length;
    say(this.status, `${entries(n)}${data.truncated ? " (the most recently used; more exist)" : ""}`);
    if (!n) {
      fill(this.table, h("p", { class: "muted" }, "This key has no prompt-cache entries (prompts under 1,024 tokens are never saved)."));
      return;
    }
    const head = ["Instance", "Entry", "Tokens", "Size", "Created", "Last used", "Pinned", "Reusable", "Actions"];
    const rows = data.entries.map((e) =>
      h(
        "tr",
        { "data-entry": e.id },
        h("td", {}, e.instance),
        h("td", { class: "mono" }, e.id.slice(e.instance.length + 1)),
        h("td", { class: "num" }, e.prompt_tokens ?? "—"),
        h("td", { class: "num" }, bytes(e.bytes)),
        h("td", {}, ago(e.created_unix_ms)),
        h("td", {}, ago(e.last_accessed_unix_ms)),
        h("td", {}, yesNo(e.pinned)),
        h("td", {}, yesNo(e.reusable)),
        h(
          "td",
          { class: "actions" },
          [e.pinned ? "unpin" : "pin", "evict"].map((action) =>
            h("button", { type: "button", "data-action": action, "data-entry": e.id, onclick: () => this.previewAction(e, action) }, action),
          ),
        ),
      ),
    );
    fill(this.table, h("table", {}, h("thead", {}, h("tr", {}, head.map((t) => h("th", {}, t)))), h("tbody", {}, rows)));
  }

  previewAction(entry, action) {
    const local = entry.id.slice(entry.instance.length + 1);
    const path = `/werk/v1/prompt-caches/${encodeURIComponent(entry.instance)}/${encodeURIComponent(local)}/actions`;
    return this.preview.propose(path, { action }, {
      name: action,
      preview: (dry) => [`Preview: ${action} ${entry.id} ${dry.changed ? "would change it" : "would change nothing"}.`, dry.changed],
      done: (done) => `${action} ${entry.id}: ${done.changed ? "done" : "nothing changed"}.`,
      after: () => this.refresh(),
    });
  }

  previewPrune(selector) {
    return this.preview.propose("/werk/v1/prompt-caches/prune", { selector }, {
      name: "Prune",
      preview: (dry) => [`Preview: the prune matches ${entries(dry.matched)} (${bytes(dry.bytes)}); nothing is removed until you confirm.`, dry.matched > 0],
      done: (done) => `Pruned: ${done.removed} of ${entries(done.matched)} removed (${bytes(done.bytes)}).`,
      after: () => this.refresh(),
    });
  }

  async refreshCounters() {
    let samples;
    try {
      samples = parseMetrics(await metricsText());
    } catch (err) {
      fill(this.counters, h("p", { class: "error" }, `Could not read /metrics: ${err.message}`));
      return;
    }
    const named = samples.filter((s) => s.name.startsWith("werk_chat_prompt_cache_") || s.name === "werk_prompt_cache_bytes");
    const instances = [...new Set(named.map((s) => s.labels.instance))];
    if (!instances.length) {
      fill(this.counters, h("p", { class: "muted" }, "No prompt-cache activity yet."));
      return;
    }
    const of = (name, instance) => sum(samples, name, { instance });
    const rows = instances.map((i) =>
      h(
        "tr",
        { "data-instance": i },
        h("td", {}, i),
        h("td", { class: "num" }, bytes(of("werk_prompt_cache_bytes", i))),
        ["saves", "hits", "misses", "restored_tokens"].map((c) => h("td", { class: "num" }, of(`werk_chat_prompt_cache_${c}_total`, i))),
      ),
    );
    const head = ["Instance", "Saved bytes", "Saves", "Hits", "Misses", "Restored tokens"];
    fill(this.counters, h("table", {}, h("thead", {}, h("tr", {}, head.map((t) => h("th", {}, t)))), h("tbody", {}, rows)));
  }
}
