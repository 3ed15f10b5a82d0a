// Scenario 1: parallel vs serial ESI. An ESI page with INCLUDES includes of
// uncacheable fragments, each delayed 50-200 ms at the origin (a fixed
// permutation, so they finish out of order), flat or NESTED levels deep.
// Metric: time to last byte (http_req_duration), time to first byte
// (http_req_waiting). The harness adds the proxy's CPU time per request.
//
//   K6_NO_USAGE_REPORT=true k6 run -e TARGET=http://127.0.0.1:6081 \
//     -e INCLUDES=10 -e NESTED=0 -e VUS=10 -e ITERATIONS=40 loadtests/k6/esi.js
import http from 'k6/http';
import { check } from 'k6';
import { TREND_STATS, envInt, envStr, summarize, target } from './lib.js';

const N = envInt('INCLUDES', 10);
const NESTED = envInt('NESTED', 0);
const VUS = envInt('VUS', 10);
const ITERATIONS = envInt('ITERATIONS', 40);
const MIN_MS = envInt('MIN_DELAY_MS', 50);
const MAX_MS = envInt('MAX_DELAY_MS', 200);

/**
 * Fragment delays spread evenly over [MIN_MS, MAX_MS] in a scrambled order
 * (i * k mod n with k coprime to n); one include gets MAX_MS, so the slowest
 * include is MAX_MS for every template size.
 */
function fragmentDelays(n) {
  if (n <= 1) return [MAX_MS];
  const gcd = (a, b) => (b === 0 ? a : gcd(b, a % b));
  const k = [7, 11, 13, 17, 19, 23, 29].find((p) => gcd(p, n) === 1);
  const out = [];
  for (let i = 0; i < n; i++) {
    const slot = (i * k) % n;
    out.push(MIN_MS + Math.round(((MAX_MS - MIN_MS) * slot) / (n - 1)));
  }
  return out;
}

// DELAYS=100,50,... overrides the built-in spread (the harness passes it so
// its report names the exact delays).
const DELAYS = __ENV.DELAYS ? __ENV.DELAYS.split(',').map(Number) : fragmentDelays(N);
if (DELAYS.length !== N || DELAYS.some((d) => !Number.isInteger(d) || d < 0)) {
  throw new Error(`DELAYS must be ${N} non-negative integers, got ${__ENV.DELAYS}`);
}
const URL = `${target()}/esi/page?n=${N}&nested=${NESTED}&cacheable=0&delays=${DELAYS.join(',')}`;
// Every fragment at every level is one `class="fragment"` element.
const EXPECTED_FRAGMENTS = N * (NESTED + 1);

const thresholds = {
  http_req_failed: ['rate<0.01'],
  checks: ['rate>0.99'],
};
// Optional latency targets (the harness sets them for Inlay's parallel ESI).
if (__ENV.P50_MAX_MS) thresholds.http_req_duration = [`p(50)<=${envInt('P50_MAX_MS')}`];
if (__ENV.TTFB_P50_MAX_MS) thresholds.http_req_waiting = [`p(50)<=${envInt('TTFB_P50_MAX_MS')}`];

export const options = {
  scenarios: {
    esi: {
      executor: 'shared-iterations',
      vus: VUS,
      iterations: ITERATIONS,
      maxDuration: envStr('MAX_DURATION', '120s'),
      gracefulStop: '5s',
    },
  },
  thresholds,
  summaryTrendStats: TREND_STATS,
};

export default function () {
  const res = http.get(URL, { tags: { name: 'esi-page' } });
  const body = res.body || '';
  check(res, {
    'status 200': (r) => r.status === 200,
    'no ESI markup left': () => body.indexOf('<esi:') < 0,
    'every fragment assembled': () => (body.match(/class="fragment"/g) || []).length === EXPECTED_FRAGMENTS,
  });
}

export function handleSummary(data) {
  return summarize(data, ['http_req_duration', 'http_req_waiting', 'http_reqs', 'checks', 'http_req_failed']);
}
