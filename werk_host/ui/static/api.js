// The page's one way to the host: fetch with the key from this tab's sessionStorage as
// "Authorization: Bearer KEY" (never a URL, never a cookie, never logged), and only the
// protocol's own routes (docs/ui.md). A 401 anywhere signs the tab out.

const KEY = "werk.ui.key";

export function signedIn() {
  return sessionStorage.getItem(KEY) !== null;
}

export function signIn(key) {
  sessionStorage.setItem(KEY, key);
}

export function signOut() {
  sessionStorage.removeItem(KEY);
}

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function headers(extra = {}) {
  const out = { Accept: "application/json", ...extra };
  const key = sessionStorage.getItem(KEY);
  if (key) out.Authorization = `Bearer ${key}`;
  return out;
}

function refused(status) {
  if (status === 401) {
    signOut();
    window.dispatchEvent(new CustomEvent("werk-signed-out"));
  }
}

function errorOf(status, doc, fallback) {
  const error = doc && doc.error;
  if (typeof error === "string") return new ApiError(status, "", error);
  if (error && typeof error === "object") {
    return new ApiError(status, error.code || error.type || "", error.message || fallback);
  }
  return new ApiError(status, "", fallback);
}

/** A JSON call; answers the envelope's `data` (or the whole document outside /werk/v1). */
export async function call(method, path, body) {
  const init = { method, headers: headers(), cache: "no-store", credentials: "omit" };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(path, init);
  const text = await resp.text();
  let doc = null;
  try {
    doc = JSON.parse(text);
  } catch {
    doc = null;
  }
  if (!resp.ok) {
    refused(resp.status);
    throw errorOf(resp.status, doc, `${resp.status} ${resp.statusText}`);
  }
  if (path.startsWith("/werk/v1/") && doc && typeof doc === "object" && "data" in doc) return doc.data;
  return doc;
}

/** A file's bytes as a data: URL (a job's result image or audio: the page's CSP allows data: for both). */
export async function dataUrl(path) {
  const resp = await fetch(path, { headers: headers({ Accept: "image/png, audio/*, application/json" }), cache: "no-store", credentials: "omit" });
  if (!resp.ok) {
    refused(resp.status);
    throw new ApiError(resp.status, "", `${resp.status} ${resp.statusText}`);
  }
  const blob = await resp.blob();
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(blob);
  });
}

/** GET /metrics as text (the Prometheus text format). */
export async function metricsText() {
  const resp = await fetch("/metrics", { headers: headers({ Accept: "text/plain" }), cache: "no-store", credentials: "omit" });
  if (!resp.ok) {
    refused(resp.status);
    throw new ApiError(resp.status, "", `${resp.status} ${resp.statusText}`);
  }
  return resp.text();
}

/**
 * POST a streamed OpenAI chat completion; calls onEvent(parsed JSON) for every `data:` event
 * until `[DONE]`. Throws ApiError when the answer is not a stream.
 */
export async function streamChat(body, onEvent, signal) {
  const resp = await fetch("/v1/chat/completions", {
    method: "POST",
    headers: headers({ "Content-Type": "application/json", Accept: "text/event-stream" }),
    body: JSON.stringify(body),
    cache: "no-store",
    credentials: "omit",
    signal,
  });
  if (!resp.ok) {
    let doc = null;
    try {
      doc = await resp.json();
    } catch {
      doc = null;
    }
    refused(resp.status);
    throw errorOf(resp.status, doc, `${resp.status} ${resp.statusText}`);
  }
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, cut).replace(/\r$/, "");
      buffer = buffer.slice(cut + 1);
      if (!line.startsWith("data:")) continue;
      const payload = line.slice(5).trim();
      if (payload === "[DONE]") return;
      let event;
      try {
        event = JSON.parse(payload);
      } catch {
        continue;
      }
      if (event && event.error) throw errorOf(200, event, "the stream ended with an error");
      onEvent(event);
    }
  }
}
