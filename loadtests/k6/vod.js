// Scenario 3: persistent vs memory storage, a video-on-demand workload.
// OBJECTS objects of SIZE bytes (/bytes/SIZE?id=N, cacheable for an hour,
// the origin waiting ORIGIN_DELAY_MS before each, like a remote object
// store), REQUESTS requests for random objects from VUS virtual users. The
// sequence is a fixed function of the request number and SEED, so every
// target and every run sees the same requests (FIRST: start further on). The harness compares run
// times (state.testRunDurationMs) and samples the proxy's resident memory.
//
//   K6_NO_USAGE_REPORT=true k6 run -e TARGET=http://127.0.0.1:6081 \
//     -e OBJECTS=1000 -e REQUESTS=50000 loadtests/k6/vod.js
import http from 'k6/http';
import { check } from 'k6';
import exec from 'k6/execution';
import { Rate } from 'k6/metrics';
import { TREND_STATS, envInt, envStr, isHit, mix32, summarize, target } from './lib.js';

const BASE = target();
const OBJECTS = envInt('OBJECTS', 1000);
const SIZE = envInt('SIZE', 1048576);
const DELAY = envInt('ORIGIN_DELAY_MS', 50);
const SEED = envInt('SEED', 1);
// Index of this run's first request in the SEED sequence: the harness splits
// the seed's 50,000 requests into one slice per A/B pair.
const FIRST = envInt('FIRST', 0);
const hits = new Rate('cache_hit');

export const options = {
  scenarios: {
    vod: {
      executor: 'shared-iterations',
      vus: envInt('VUS', 16),
      iterations: envInt('REQUESTS', 50000),
      maxDuration: envStr('MAX_DURATION', '300s'),
      gracefulStop: '10s',
    },
  },
  discardResponseBodies: true,
  thresholds: {
    http_req_failed: ['rate<0.01'],
    checks: ['rate>0.99'],
  },
  summaryTrendStats: TREND_STATS,
};

/** The URL of object `id` (the harness uses the same form to warm and probe). */
export function objectUrl(id) {
  return `${BASE}/bytes/${SIZE}?id=${id}&cc=max-age%3D3600&delay_ms=${DELAY}`;
}

export default function () {
  const id = mix32((exec.scenario.iterationInTest + FIRST) ^ Math.imul(SEED, 0x9e3779b1)) % OBJECTS;
  const res = http.get(objectUrl(id), { tags: { name: 'object' } });
  hits.add(isHit(res));
  check(res, { 'status 200': (r) => r.status === 200 });
}

export function handleSummary(data) {
  return summarize(data, ['http_req_duration', 'http_reqs', 'data_received', 'cache_hit', 'checks', 'http_req_failed']);
}
