// A parser for the Prometheus text format that GET /metrics answers (docs/operations.md,
// "Metrics"): comment lines skipped, one {name, labels, value} per sample line.

const LINE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?$/;
const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?\s*/gy;

function unescape(value) {
  return value.replace(/\\(n|\\|")/g, (_, c) => (c === "n" ? "\n" : c));
}

export function parseMetrics(text) {
  const samples = [];
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (!line || line.startsWith("#")) continue;
    const match = LINE.exec(line);
    if (!match) continue;
    const labels = {};
    if (match[3]) {
      LABEL.lastIndex = 0;
      let m;
      while ((m = LABEL.exec(match[3])) !== null) labels[m[1]] = unescape(m[2]);
    }
    const value = match[4] === "+Inf" ? Infinity : match[4] === "-Inf" ? -Infinity : Number(match[4]);
    samples.push({ name: match[1], labels, value });
  }
  return samples;
}

function matches(sample, name, labels) {
  if (sample.name !== name) return false;
  for (const [k, v] of Object.entries(labels)) if (sample.labels[k] !== v) return false;
  return true;
}

/** The sum of every sample of `name` whose labels include `labels`. */
export function sum(samples, name, labels = {}) {
  let total = 0;
  for (const s of samples) if (matches(s, name, labels)) total += s.value;
  return total;
}

/** The q-quantile (0..1) of a histogram's buckets (summed over the matching series), by linear
 * interpolation inside the bucket, as Prometheus's histogram_quantile does; null without data. */
export function quantile(samples, name, labels, q) {
  const buckets = new Map();
  for (const s of samples) {
    if (!matches(s, `${name}_bucket`, labels)) continue;
    const le = s.labels.le === "+Inf" ? Infinity : Number(s.labels.le);
    buckets.set(le, (buckets.get(le) || 0) + s.value);
  }
  const bounds = [...buckets.keys()].sort((a, b) => a - b);
  if (!bounds.length) return null;
  const total = buckets.get(bounds[bounds.length - 1]);
  if (!total) return null;
  const rank = q * total;
  let lower = 0;
  let below = 0;
  for (const le of bounds) {
    const count = buckets.get(le);
    if (count >= rank) {
      if (le === Infinity) return lower;
      const inBucket = count - below;
      return inBucket > 0 ? lower + ((le - lower) * (rank - below)) / inBucket : le;
    }
    lower = le;
    below = count;
  }
  return lower;
}
