// Instances: GET /werk/v1/deployments (inventory, plans, slots), polled while shown. Operators
// (see app.js, "role") get load/unload/pin buttons (POST /werk/v1/deployments/{id}/actions) and
// the log tail (GET /werk/v1/deployments/{id}/logs); docs/deployments.md, "Operator actions".

import { call } from "./api.js";
import { ago, bytes, fill, h, say, seconds } from "./util.js";

function keepAlive(entry) {
  if (entry.keep_alive_seconds === null) return "forever";
  if (entry.state !== "ready") return seconds(entry.keep_alive_seconds);
  if (entry.in_flight > 0 || entry.last_used_unix_ms === null) return `${seconds(entry.keep_alive_seconds)} once idle`;
  const left = (entry.last_used_unix_ms + entry.keep_alive_seconds * 1000 - Date.now()) / 1000;
  return `${seconds(left)} left`;
}

export class InstancesView {
  constructor(root, ctx) {
    this.ctx = ctx;
    this.status = h("p", { class: "status", id: "instances-status", role: "status" });
    this.table = h("div", { id: "instances-table" });
    this.logs = h("div", { id: "instances-logs" });
    fill(root, h("h2", {}, "Instances"), this.status, this.table, this.logs);
    this.logInstance = null;
  }

  async refresh() {
    let report;
    try {
      report = await call("GET", "/werk/v1/deployments");
    } catch (err) {
      say(this.status, `Could not read the instances: ${err.message}`, true);
      return;
    }
    this.render(report);
    if (this.logInstance) await this.showLogs(this.logInstance);
  }

  render(report) {
    const plans = Object.fromEntries(report.plans.map((p) => [p.instance, p.plan]));
    const slots = Object.fromEntries(report.slots.map((s) => [s.instance, s]));
    const operator = this.ctx.operator;
    const head = ["Instance", "Backend", "Model", "State", "PID", "Context / slot", "Slots busy / total", "In flight", "Keep-alive", "Memory", "Pinned"];
    if (operator) head.push("Actions");
    const rows = report.inventory.map((entry) => {
      const plan = plans[entry.id];
      const slot = slots[entry.id] || {};
      const state = [h("span", { class: `state state-${entry.state}` }, entry.state)];
      if (entry.state_since_unix_ms) state.push(h("small", {}, ` since ${ago(entry.state_since_unix_ms)}`));
      if (entry.error) state.push(h("div", { class: "reason" }, entry.error));
      const cells = [
        h("td", {}, entry.id, entry.default ? h("small", {}, " (default)") : null, entry.aliases.length ? h("div", { class: "muted" }, entry.aliases.join(", ")) : null),
        h("td", {}, entry.backend),
        h("td", {}, entry.model),
        h("td", { class: "state-cell", "data-instance": entry.id }, state),
        h("td", { class: "num" }, entry.pid ?? "—"),
        h("td", { class: "num" }, plan && plan.context_per_slot !== null ? plan.context_per_slot : "—"),
        h("td", { class: "num" }, `${slot.busy ?? 0} / ${slot.total ?? "—"}`),
        h("td", { class: "num" }, entry.in_flight),
        h("td", {}, keepAlive(entry)),
        h("td", { class: "num" }, bytes(entry.memory_estimate_bytes)),
        h("td", {}, entry.pinned ? "yes" : "no"),
      ];
      if (operator) cells.push(h("td", { class: "actions" }, this.buttons(entry)));
      return h("tr", { "data-instance": entry.id }, cells);
    });
    if (!rows.length) {
      fill(this.table, h("p", { class: "muted" }, "No deployment instances."));
      return;
    }
    const note = operator ? null : h("p", { class: "muted", id: "instances-client-note" }, "Loading, unloading, pinning and the logs are an operator's (docs/deployments.md, \"Residency\"); this key is a client's.");
    fill(this.table, h("table", {}, h("thead", {}, h("tr", {}, head.map((t) => h("th", {}, t)))), h("tbody", {}, rows)), note);
  }

  buttons(entry) {
    const act = (action) =>
      h("button", { type: "button", "data-action": action, "data-instance": entry.id, onclick: () => this.act(entry.id, action) }, action);
    return [
      entry.state === "cold" || entry.state === "failed" ? act("load") : act("unload"),
      entry.pinned ? act("unpin") : act("pin"),
      h("button", { type: "button", "data-action": "logs", "data-instance": entry.id, onclick: () => this.showLogs(entry.id) }, "logs"),
    ];
  }

  async act(id, action) {
    say(this.status, `${action} ${id}…`);
    try {
      const result = await call("POST", `/werk/v1/deployments/${encodeURIComponent(id)}/actions`, { action });
      say(this.status, `${action} ${id}: now ${result.instance.state}`);
    } catch (err) {
      say(this.status, `${action} ${id} refused (${err.status}): ${err.message}`, true);
    }
    await this.refresh();
  }

  async showLogs(id) {
    this.logInstance = id;
    let logs;
    try {
      logs = await call("GET", `/werk/v1/deployments/${encodeURIComponent(id)}/logs?lines=50`);
    } catch (err) {
      fill(this.logs, h("p", { class: "error" }, `Log of ${id}: ${err.message}`));
      return;
    }
    fill(
      this.logs,
      h("h3", {}, `Log of ${id}`, " ", h("button", { type: "button", onclick: () => this.hideLogs() }, "close")),
      h("pre", { class: "log", id: "instance-events" }, logs.lines.join("\n") || "(no events)"),
      h("h4", {}, "Backend log"),
      h("pre", { class: "log", id: "instance-backend-log" }, logs.backend_lines === null ? "(not loaded, or the backend keeps no log)" : logs.backend_lines.join("\n")),
    );
  }

  hideLogs() {
    this.logInstance = null;
    fill(this.logs);
  }
}
