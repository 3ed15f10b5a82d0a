// Helpers shared by the k6 scenarios of loadtests/k6/ (local module, no
// remote imports): environment parsing, cache-hit detection for Inlay and
// Varnish, and the end-of-test summary (JSON file for the harness + a short
// text summary on stdout).

// Percentiles every scenario reports, so the harness can draw distributions.
export const TREND_STATS = [
  'avg', 'min', 'med', 'p(10)', 'p(25)', 'p(50)', 'p(75)', 'p(90)', 'p(95)',
  'p(99)', 'p(99.9)', 'max', 'count',
];

/** A string from the environment (`-e NAME=...`), or `def`. */
export function envStr(name, def) {
  const v = __ENV[name];
  if (v === undefined || v === '') {
    if (def === undefined) {
      throw new Error(`environment variable ${name} is required`);
    }
    return def;
  }
  return v;
}

/** A non-negative integer from the environment, or `def`. */
export function envInt(name, def) {
  const raw = envStr(name, def === undefined ? undefined : String(def));
  const v = Number(raw);
  if (!Number.isInteger(v) || v < 0) {
    throw new Error(`environment variable ${name} must be a non-negative integer, got ${raw}`);
  }
  return v;
}

/** The target's base URL without a trailing slash. */
export function target() {
  return envStr('TARGET').replace(/\/+$/, '');
}

/**
 * Whether a response came from the cache: Inlay says so in Cache-Status
 * (RFC 9211, `inlay; hit`), Varnish by putting two transaction ids in
 * X-Varnish (the request's and the cached object's).
 */
export function isHit(res) {
  const cs = res.headers['Cache-Status'];
  if (cs !== undefined) {
    return /;\s*hit\b/i.test(cs);
  }
  const xv = res.headers['X-Varnish'];
  return xv !== undefined && xv.trim().split(/\s+/).length === 2;
}

/** A 32-bit mix (murmur3 finaliser): the same request sequence on every target. */
export function mix32(x) {
  let h = x >>> 0;
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

function fmt(v) {
  if (typeof v !== 'number') return String(v);
  return Math.abs(v) >= 100 ? v.toFixed(0) : v.toPrecision(3);
}

/**
 * The end-of-test summary: the whole data object as JSON to $SUMMARY (when
 * set), and one line per interesting metric on stdout.
 */
export function summarize(data, metrics) {
  const lines = [];
  for (const name of metrics) {
    const m = data.metrics[name];
    if (!m) continue;
    const v = m.values;
    let text;
    if (m.type === 'trend') {
      text = `p50=${fmt(v['p(50)'])} p90=${fmt(v['p(90)'])} p99=${fmt(v['p(99)'])} max=${fmt(v.max)} n=${v.count}`;
    } else if (m.type === 'rate') {
      text = `rate=${fmt(v.rate)}`;
    } else {
      text = `count=${v.count} rate=${fmt(v.rate)}/s`;
    }
    const th = m.thresholds
      ? ' ' + Object.entries(m.thresholds).map(([k, r]) => `[${k}: ${r.ok ? 'ok' : 'FAILED'}]`).join(' ')
      : '';
    lines.push(`  ${name}: ${text}${th}`);
  }
  const out = { stdout: lines.join('\n') + '\n' };
  if (__ENV.SUMMARY) {
    out[__ENV.SUMMARY] = JSON.stringify(data);
  }
  return out;
}
