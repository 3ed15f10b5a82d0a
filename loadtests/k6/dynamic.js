// Scenario 4: cache vs no cache in front of a slow dynamic origin. The
// origin renders /dynamic in DELAY_MS (default 150 ms); MODE=nocache asks
// for it as is (Cache-Control: no-store, every request waits for the
// origin), MODE=cache with cc=public, max-age=3600 (one miss, then hits).
// VUS concurrent users loop for DURATION (and at most MAX_REQUESTS
// requests). Metrics: requests/s (http_reqs rate) and latency percentiles.
//
//   K6_NO_USAGE_REPORT=true k6 run -e TARGET=http://127.0.0.1:6081 \
//     -e MODE=nocache -e VUS=50 -e DURATION=5s loadtests/k6/dynamic.js
import http from 'k6/http';
import { check } from 'k6';
import { Rate } from 'k6/metrics';
import { TREND_STATS, envInt, envStr, isHit, summarize, target } from './lib.js';

const MODE = envStr('MODE', 'cache');
if (MODE !== 'cache' && MODE !== 'nocache') {
  throw new Error(`MODE must be cache or nocache, got ${MODE}`);
}
const DELAY = envInt('DELAY_MS', 150);
const SIZE = envInt('SIZE', 8192);
const cc = MODE === 'cache' ? '&cc=public%2C%20max-age%3D3600' : '';
const URL = `${target()}/dynamic?delay_ms=${DELAY}&size=${SIZE}${cc}`;
const hits = new Rate('cache_hit');

const thresholds = {
  http_req_failed: ['rate<0.01'],
  checks: ['rate>0.99'],
};
if (__ENV.P50_MAX_MS) thresholds.http_req_duration = [`p(50)<=${envInt('P50_MAX_MS')}`];

export const options = {
  scenarios: {
    dynamic: {
      executor: 'shared-iterations',
      vus: envInt('VUS', 50),
      iterations: envInt('MAX_REQUESTS', 1000000),
      maxDuration: envStr('DURATION', '5s'),
      gracefulStop: '2s',
    },
  },
  discardResponseBodies: true,
  thresholds,
  summaryTrendStats: TREND_STATS,
};

export default function () {
  const res = http.get(URL, { tags: { name: MODE } });
  hits.add(isHit(res));
  check(res, { 'status 200': (r) => r.status === 200 });
}

export function handleSummary(data) {
  return summarize(data, ['http_req_duration', 'http_reqs', 'cache_hit', 'checks', 'http_req_failed']);
}
