// Playground: a streamed POST /v1/chat/completions against a model, instance or alias from
// GET /v1/models, with "stream_options": {"include_usage": true}; shows tokens/s (the backend's
// own "timings" when the stream carries them, else the completion tokens from usage over the
// time from the first to the last token as received) and the prompt tokens the
// prompt cache supplied (usage.prompt_tokens_details.cached_tokens, docs/prompt-cache.md).

import { call, streamChat } from "./api.js";
import { fill, h, num, say } from "./util.js";

export class PlaygroundView {
  constructor(root) {
    this.model = h("select", { id: "play-model" });
    this.prompt = h("textarea", { id: "play-prompt", rows: 4, cols: 80 }, "Say hello in one short sentence.");
    this.maxTokens = h("input", { id: "play-max-tokens", type: "number", min: 1, value: 64 });
    this.send = h("button", { type: "submit", id: "play-send" }, "Send");
    this.stopButton = h("button", { type: "button", id: "play-stop", disabled: true, onclick: () => this.abort && this.abort.abort() }, "Stop");
    this.notice = h("div", { id: "play-notice", class: "muted" });
    this.output = h("pre", { id: "play-output", class: "answer" });
    this.stats = h("p", { id: "play-stats", class: "status", role: "status" });
    const form = h(
      "form",
      { id: "play-form", onsubmit: (e) => (e.preventDefault(), this.run()) },
      h("label", {}, "Model ", this.model),
      " ",
      h("label", {}, "max tokens ", this.maxTokens),
      h("div", {}, this.prompt),
      this.send,
      " ",
      this.stopButton,
    );
    fill(root, h("h2", {}, "Playground"), form, this.notice, this.output, this.stats);
    this.loaded = false;
  }

  async refresh() {
    if (this.loaded) return;
    try {
      const listing = await call("GET", "/v1/models");
      const ids = (listing.data || []).map((m) => m.id);
      fill(this.model, ids.map((id) => h("option", { value: id }, id)));
      this.loaded = true;
    } catch (err) {
      say(this.stats, `Could not list models: ${err.message}`, true);
    }
  }

  async run() {
    const body = {
      model: this.model.value,
      messages: [{ role: "user", content: this.prompt.value }],
      stream: true,
      stream_options: { include_usage: true },
      max_tokens: Number(this.maxTokens.value) || 64,
    };
    fill(this.output);
    fill(this.notice);
    say(this.stats, "streaming…");
    this.send.disabled = true;
    this.stopButton.disabled = false;
    this.abort = new AbortController();
    const started = performance.now();
    let first = null;
    let last = null;
    let usage = null;
    let pieces = 0;
    let timings = null;
    try {
      await streamChat(
        body,
        (event) => {
          if (event.usage) usage = event.usage;
          if (event.timings && typeof event.timings === "object") timings = event.timings;
          const delta = event.choices && event.choices[0] && event.choices[0].delta;
          if (!delta) return;
          if (delta.reasoning_content) this.notice.append(delta.reasoning_content);
          if (delta.content) {
            if (event.werk_notice) return;
            const now = performance.now();
            if (first === null) first = now;
            last = now;
            pieces += 1;
            this.output.append(delta.content);
          }
        },
        this.abort.signal,
      );
      say(this.stats, this.summary(started, first, last, pieces, usage, timings));
      this.stats.dataset.done = "yes";
    } catch (err) {
      say(this.stats, err.name === "AbortError" ? "stopped" : `refused (${err.status}): ${err.message}`, err.name !== "AbortError");
      this.stats.dataset.done = "error";
    } finally {
      this.send.disabled = false;
      this.stopButton.disabled = true;
    }
  }

  summary(started, first, last, pieces, usage, timings) {
    const parts = [];
    if (first !== null) parts.push(`first token after ${num(first - started)} ms`);
    const tokens = usage ? usage.completion_tokens : pieces;
    if (timings && typeof timings.predicted_per_second === "number") {
      parts.push(`${num(timings.predicted_per_second, 1)} tokens/s (the backend's timing)`);
    } else if (first !== null && last !== null && last > first && tokens > 1) {
      parts.push(`${num(((tokens - 1) * 1000) / (last - first), 1)} tokens/s (as received)`);
    }
    if (usage) {
      parts.push(`${usage.prompt_tokens} prompt + ${usage.completion_tokens} completion tokens`);
      const cached = usage.prompt_tokens_details ? usage.prompt_tokens_details.cached_tokens : null;
      parts.push(cached ? `prompt cache reused: ${cached} cached prompt tokens` : "prompt cache reused: no (0 cached prompt tokens)");
    } else {
      parts.push("no usage reported");
    }
    return parts.join(" · ");
  }
}
