// States and caches of this key: GET /werk/v1/states (the key's own named states, paged), with
// pin/unpin/evict (POST /werk/v1/states/{id}/actions) and prune (POST /werk/v1/states/prune).
// Every mutation is first sent with "dry_run": true and its preview shown; only the user's
// confirmation sends the same request with "dry_run": false (docs/states.md; docs/ui.md).
// Prompt caches have no per-key listing in the protocol: their per-instance counters and bytes
// are on /metrics (docs/prompt-cache.md, "Visible"), shown here as the host reports them.

import { call, metricsText } from "./api.js";
import { parseMetrics, sum } from "./metrics.js";
import { ago, bytes, fill, h, say } from "./util.js";

const PAGES = 10;

export class StatesView {
  constructor(root) {
    this.status = h("p", { class: "status", id: "states-status", role: "status" });
    this.table = h("div", { id: "states-table" });
    this.preview = h("div", { id: "states-preview", class: "preview" });
    this.experimental = h("input", { type: "checkbox", id: "states-experimental" });
    this.kind = h(
      "select",
      { id: "prune-kind", onchange: () => (this.value.hidden = this.kind.value === "all") },
      h("option", { value: "older" }, "older than (minutes)"),
      h("option", { value: "model" }, "model id"),
      h("option", { value: "tier" }, "tier"),
      h("option", { value: "all" }, "all of this key's states"),
    );
    this.value = h("input", { id: "prune-value", value: "60", size: 16 });
    const form = h(
      "form",
      { id: "prune-form", class: "inline", onsubmit: (e) => (e.preventDefault(), this.previewPrune()) },
      h("strong", {}, "Prune "),
      this.kind,
      this.value,
      h("button", { type: "submit", id: "prune-preview" }, "Preview"),
    );
    this.caches = h("div", { id: "prompt-caches" });
    fill(
      root,
      h("h2", {}, "Named states of this key"),
      this.status,
      h("p", {}, h("label", {}, this.experimental, " allow experimental capabilities (allow_experimental) for actions")),
      form,
      this.preview,
      this.table,
      h("h2", {}, "Prompt caches"),
      this.caches,
    );
  }

  async refresh() {
    const states = [];
    try {
      let cursor = null;
      for (let page = 0; page < PAGES; page += 1) {
        const query = cursor ? `?cursor=${encodeURIComponent(cursor)}` : "";
        const data = await call("GET", `/werk/v1/states${query}`);
        states.push(...data.states);
        cursor = data.next_cursor;
        if (!cursor) break;
      }
    } catch (err) {
      say(this.status, `Could not list states: ${err.message}`, true);
      return;
    }
    say(this.status, `${states.length} state${states.length === 1 ? "" : "s"}`);
    this.render(states);
    await this.refreshCaches();
  }

  render(states) {
    if (!states.length) {
      fill(this.table, h("p", { class: "muted" }, "This key has no named states."));
      return;
    }
    const head = ["State", "Model", "Tier", "Status", "Size", "Created", "Last used", "Expires", "Pinned", "Reusable", "Actions"];
    const rows = states.map((s) =>
      h(
        "tr",
        { "data-state": s.id },
        h("td", { class: "mono" }, s.id),
        h("td", {}, s.model_id),
        h("td", {}, s.tier),
        h("td", {}, s.status),
        h("td", { class: "num" }, bytes(s.bytes)),
        h("td", {}, ago(s.created_unix_ms)),
        h("td", {}, ago(s.last_accessed_unix_ms)),
        h("td", {}, s.expires_unix_ms === null ? "never" : new Date(s.expires_unix_ms).toISOString()),
        h("td", {}, s.pinned ? "yes" : "no"),
        h("td", {}, s.reusable ? "yes" : "no"),
        h(
          "td",
          { class: "actions" },
          [s.pinned ? "unpin" : "pin", "evict"].map((action) =>
            h("button", { type: "button", "data-action": action, "data-state": s.id, onclick: () => this.previewAction(s.id, action) }, action),
          ),
        ),
      ),
    );
    fill(this.table, h("table", {}, h("thead", {}, h("tr", {}, head.map((t) => h("th", {}, t)))), h("tbody", {}, rows)));
  }

  selector() {
    const kind = this.kind.value;
    const value = this.value.value.trim();
    if (kind === "all") return { kind: "all", confirm: true };
    if (kind === "model") return { kind: "filter", model_id: value };
    if (kind === "tier") return { kind: "filter", tier: value };
    const minutes = Number(value);
    if (!Number.isFinite(minutes) || minutes < 0) throw new Error("minutes must be a number ≥ 0");
    return { kind: "filter", older_than_unix_ms: Math.max(0, Math.floor(Date.now() - minutes * 60000)) };
  }

  async previewPrune() {
    let selector;
    try {
      selector = this.selector();
    } catch (err) {
      this.showPreview(err.message, true);
      return;
    }
    try {
      const dry = await call("POST", "/werk/v1/states/prune", { selector, dry_run: true });
      const text = `Preview: ${dry.matched} state(s) match (${bytes(dry.bytes)}); nothing is removed until you confirm.`;
      this.showPreview(text, false, dry.matched > 0 ? () => this.prune(selector) : null);
    } catch (err) {
      this.showPreview(`Prune preview refused (${err.status}): ${err.message}`, true);
    }
  }

  async prune(selector) {
    try {
      const done = await call("POST", "/werk/v1/states/prune", { selector, dry_run: false });
      this.showPreview(`Pruned: ${done.removed} of ${done.matched} state(s) removed (${bytes(done.bytes)}).`);
    } catch (err) {
      this.showPreview(`Prune refused (${err.status}): ${err.message}`, true);
    }
    await this.refresh();
  }

  async previewAction(id, action) {
    const body = { action, dry_run: true, allow_experimental: this.experimental.checked };
    const path = `/werk/v1/states/${encodeURIComponent(id)}/actions`;
    try {
      const dry = await call("POST", path, body);
      const text = `Preview: ${action} ${id} ${dry.changed ? "would change it" : "would change nothing"}.`;
      this.showPreview(text, false, dry.changed ? () => this.act(path, { ...body, dry_run: false }, id, action) : null);
    } catch (err) {
      this.showPreview(`${action} preview refused (${err.status}): ${err.message}`, true);
    }
  }

  async act(path, body, id, action) {
    try {
      const done = await call("POST", path, body);
      this.showPreview(`${action} ${id}: ${done.changed ? "done" : "nothing changed"}.`);
    } catch (err) {
      this.showPreview(`${action} refused (${err.status}): ${err.message}`, true);
    }
    await this.refresh();
  }

  showPreview(text, error = false, confirm = null) {
    const buttons = confirm
      ? [
          h("button", { type: "button", id: "preview-confirm", class: "danger", onclick: confirm }, "Confirm"),
          h("button", { type: "button", id: "preview-cancel", onclick: () => fill(this.preview) }, "Cancel"),
        ]
      : [];
    fill(this.preview, h("span", { id: "preview-text", class: error ? "error" : "" }, text), " ", buttons);
  }

  async refreshCaches() {
    let samples;
    try {
      samples = parseMetrics(await metricsText());
    } catch (err) {
      fill(this.caches, h("p", { class: "error" }, `Could not read /metrics: ${err.message}`));
      return;
    }
    const instances = [...new Set(samples.filter((s) => s.name.startsWith("werk_chat_prompt_cache_") || s.name === "werk_prompt_cache_bytes").map((s) => s.labels.instance))];
    if (!instances.length) {
      fill(this.caches, h("p", { class: "muted" }, "No prompt-cache activity yet."));
      return;
    }
    const of = (name, instance) => sum(samples, name, { instance });
    const rows = instances.map((i) =>
      h(
        "tr",
        {},
        h("td", {}, i),
        h("td", { class: "num" }, bytes(of("werk_prompt_cache_bytes", i))),
        h("td", { class: "num" }, of("werk_chat_prompt_cache_saves_total", i)),
        h("td", { class: "num" }, of("werk_chat_prompt_cache_hits_total", i)),
        h("td", { class: "num" }, of("werk_chat_prompt_cache_misses_total", i)),
        h("td", { class: "num" }, of("werk_chat_prompt_cache_restored_tokens_total", i)),
      ),
    );
    fill(
      this.caches,
      h("p", { class: "muted" }, "Per instance, all keys together: the protocol lists no key's prompt-cache entries (docs/ui.md)."),
      h("table", {}, h("thead", {}, h("tr", {}, ["Instance", "Saved bytes", "Saves", "Hits", "Misses", "Restored tokens"].map((t) => h("th", {}, t)))), h("tbody", {}, rows)),
    );
  }
}
