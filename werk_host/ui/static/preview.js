// Preview, then confirm: the one way the page changes stored data (named states and prompt
// caches). Every mutation is first sent with "dry_run": true and its answer shown; only the
// user's Confirm sends the same request with "dry_run": false; Cancel sends nothing
// (docs/states.md, docs/prompt-cache.md "Routes", docs/ui.md).

import { call } from "./api.js";
import { fill, h } from "./util.js";

export class Preview {
  /** A preview area; its elements' ids start with `prefix` (e.g. "states-preview-text"). */
  constructor(prefix) {
    this.prefix = prefix;
    this.el = h("div", { id: `${prefix}-preview`, class: "preview" });
  }

  show(text, error = false, confirm = null) {
    const p = this.prefix;
    const buttons = confirm
      ? [
          h("button", { type: "button", id: `${p}-confirm`, class: "danger", onclick: confirm }, "Confirm"),
          h("button", { type: "button", id: `${p}-cancel`, onclick: () => fill(this.el) }, "Cancel"),
        ]
      : [];
    fill(this.el, h("span", { id: `${p}-preview-text`, class: error ? "error" : "" }, text), " ", buttons);
  }

  /**
   * POST `body` to `path` as a dry run and show `how.preview(answer)` ([text, would it change
   * anything]); when it would, Confirm sends it for real, shows `how.done(answer)`, then calls
   * `how.after()`. `how.name` names the operation in refusals.
   */
  async propose(path, body, how) {
    let dry;
    try {
      dry = await call("POST", path, { ...body, dry_run: true });
    } catch (err) {
      this.show(`${how.name} preview refused (${err.status}): ${err.message}`, true);
      return;
    }
    const [text, changes] = how.preview(dry);
    this.show(text, false, changes ? () => this.confirm(path, body, how) : null);
  }

  async confirm(path, body, how) {
    this.show(`${how.name}: sending…`);
    try {
      this.show(how.done(await call("POST", path, { ...body, dry_run: false })));
    } catch (err) {
      this.show(`${how.name} refused (${err.status}): ${err.message}`, true);
    }
    await how.after();
  }
}

/**
 * A prune form: a kind (`older`: older than N minutes; `all`; or a filter field, e.g.
 * {value: "model", label: "model id", field: "model_id"}) and its value. Preview hands the
 * protocol's selector to `propose`, or shows in `preview` why the value is not usable.
 */
export class PruneForm {
  constructor(prefix, label, kinds, preview, propose) {
    this.fields = Object.fromEntries(kinds.map((k) => [k.value, k.field]));
    this.kind = h(
      "select",
      { id: `${prefix}-kind`, onchange: () => (this.value.hidden = this.kind.value === "all") },
      kinds.map((k) => h("option", { value: k.value }, k.label)),
    );
    this.value = h("input", { id: `${prefix}-value`, value: "60", size: 16 });
    const submit = (e) => {
      e.preventDefault();
      let selector;
      try {
        selector = this.selector();
      } catch (err) {
        preview.show(err.message, true);
        return;
      }
      propose(selector);
    };
    this.el = h(
      "form",
      { id: `${prefix}-form`, class: "inline", onsubmit: submit },
      h("strong", {}, `${label} `),
      this.kind,
      this.value,
      h("button", { type: "submit", id: `${prefix}-preview` }, "Preview"),
    );
  }

  selector() {
    const kind = this.kind.value;
    const value = this.value.value.trim();
    if (kind === "all") return { kind: "all", confirm: true };
    if (kind !== "older") return { kind: "filter", [this.fields[kind]]: value };
    const minutes = Number(value);
    if (value === "" || !Number.isFinite(minutes) || minutes < 0) throw new Error("minutes must be a number ≥ 0");
    return { kind: "filter", older_than_unix_ms: Math.max(0, Math.floor(Date.now() - minutes * 60000)) };
  }
}
