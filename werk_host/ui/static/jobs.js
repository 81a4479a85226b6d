// This key's media jobs (docs/media.md, "Jobs"): GET /werk/v1/jobs, polled while shown, with
// each job's status and step progress; a queued or running job can be cancelled
// (POST /werk/v1/jobs/{id}/cancel); a finished one shows its results (GET .../result/{name},
// fetched with the key and shown as data: URLs): an image job's images, a speech job's audio
// with the browser's own player.

import { call, dataUrl } from "./api.js";
import { ago, bytes, fill, h, say } from "./util.js";

const ACTIVE = new Set(["queued", "running"]);

export class JobsView {
  constructor(root) {
    this.status = h("p", { class: "status", id: "jobs-status", role: "status" });
    this.table = h("div", { id: "jobs-table" });
    this.images = h("div", { id: "jobs-images" });
    fill(root, h("h2", {}, "Jobs of this key"), this.status, this.table, this.images);
  }

  async refresh() {
    let jobs;
    try {
      jobs = await call("GET", "/werk/v1/jobs");
    } catch (err) {
      say(this.status, `Could not list jobs: ${err.message}`, true);
      return;
    }
    const running = jobs.filter((j) => ACTIVE.has(j.status)).length;
    say(this.status, `${jobs.length} job${jobs.length === 1 ? "" : "s"}, ${running} queued or running`);
    if (!jobs.length) {
      fill(this.table, h("p", { class: "muted" }, "This key has no jobs (POST /werk/v1/jobs, or a Comfy /prompt, makes one)."));
      return;
    }
    const head = ["Job", "Kind", "Model", "Status", "Progress", "Results", "Created", "Actions"];
    const rows = jobs
      .slice()
      .reverse()
      .map((j) =>
        h(
          "tr",
          { "data-job": j.id },
          h("td", { class: "mono" }, j.id),
          h("td", {}, j.kind),
          h("td", {}, j.model ?? "—"),
          h("td", {}, j.error ? `${j.status}: ${j.error.message}` : j.status),
          h("td", { class: "num" }, j.progress.steps ? `${j.progress.step}/${j.progress.steps}` : "—"),
          h("td", { class: "num" }, j.results.length ? `${j.results.length} (${bytes(j.results.reduce((n, f) => n + f.bytes, 0))})` : "—"),
          h("td", {}, ago(j.created_unix_ms)),
          h(
            "td",
            { class: "actions" },
            ACTIVE.has(j.status)
              ? h("button", { type: "button", "data-action": "cancel", onclick: () => this.cancel(j.id) }, "cancel")
              : j.results.length
                ? h("button", { type: "button", "data-action": "show", onclick: () => this.show(j) }, "show")
                : "",
          ),
        ),
      );
    fill(this.table, h("table", {}, h("thead", {}, h("tr", {}, ...head.map((c) => h("th", {}, c)))), h("tbody", {}, ...rows)));
  }

  async cancel(id) {
    try {
      await call("POST", `/werk/v1/jobs/${encodeURIComponent(id)}/cancel`);
    } catch (err) {
      say(this.status, `Could not cancel ${id}: ${err.message}`, true);
    }
    await this.refresh();
  }

  async show(job) {
    try {
      const urls = await Promise.all(
        job.results.map((f) => dataUrl(`/werk/v1/jobs/${encodeURIComponent(job.id)}/result/${encodeURIComponent(f.name)}`)),
      );
      const shown = urls.map((src, i) => {
        const file = job.results[i];
        return file.content_type.startsWith("audio/")
          ? h("audio", { src, controls: true, "aria-label": file.name, class: "job-audio" })
          : h("img", { src, alt: file.name, class: "job-image" });
      });
      fill(this.images, h("h3", {}, job.id), ...shown);
    } catch (err) {
      say(this.status, `Could not fetch the results of ${job.id}: ${err.message}`, true);
    }
  }
}
