// States and caches of this key: GET /werk/v1/states (the key's own named states, paged), with
// pin/unpin/evict (POST /werk/v1/states/{id}/actions) and prune (POST /werk/v1/states/prune);
// then the key's prompt-cache entries (promptcaches.js). Every mutation goes through
// preview.js: sent first with "dry_run": true and its preview shown; only the user's
// confirmation sends the same request with "dry_run": false (docs/states.md; docs/ui.md).

import { call } from "./api.js";
import { Preview, PruneForm } from "./preview.js";
import { PromptCachesView } from "./promptcaches.js";
import { ago, bytes, fill, h, say } from "./util.js";

const PAGES = 10;

export class StatesView {
  constructor(root) {
    this.status = h("p", { class: "status", id: "states-status", role: "status" });
    this.table = h("div", { id: "states-table" });
    this.preview = new Preview("states");
    this.experimental = h("input", { type: "checkbox", id: "states-experimental" });
    const kinds = [
      { value: "older", label: "older than (minutes)" },
      { value: "model", label: "model id", field: "model_id" },
      { value: "tier", label: "tier", field: "tier" },
      { value: "all", label: "all of this key's states" },
    ];
    const form = new PruneForm("states-prune", "Prune", kinds, this.preview, (selector) => this.previewPrune(selector));
    this.caches = new PromptCachesView();
    fill(
      root,
      h("h2", {}, "Named states of this key"),
      this.status,
      h("p", {}, h("label", {}, this.experimental, " allow experimental capabilities (allow_experimental) for actions")),
      form.el,
      this.preview.el,
      this.table,
      this.caches.el,
    );
  }

  async refresh() {
    await this.refreshStates();
    await this.caches.refresh();
  }

  async refreshStates() {
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

  previewPrune(selector) {
    return this.preview.propose("/werk/v1/states/prune", { selector }, {
      name: "Prune",
      preview: (dry) => [`Preview: ${dry.matched} state(s) match (${bytes(dry.bytes)}); nothing is removed until you confirm.`, dry.matched > 0],
      done: (done) => `Pruned: ${done.removed} of ${done.matched} state(s) removed (${bytes(done.bytes)}).`,
      after: () => this.refreshStates(),
    });
  }

  previewAction(id, action) {
    const body = { action, allow_experimental: this.experimental.checked };
    return this.preview.propose(`/werk/v1/states/${encodeURIComponent(id)}/actions`, body, {
      name: action,
      preview: (dry) => [`Preview: ${action} ${id} ${dry.changed ? "would change it" : "would change nothing"}.`, dry.changed],
      done: (done) => `${action} ${id}: ${done.changed ? "done" : "nothing changed"}.`,
      after: () => this.refreshStates(),
    });
  }
}
