// Scenario 2: time to first byte on a cache hit (a 177-byte object). One
// virtual user makes CONNS requests one after another; by default each on a
// new connection (connect, GET, read the first byte, close: the method of
// the 2013 Varnish measurement), with REUSE=1 over one keep-alive
// connection. The harness repeats it (5 runs) and alternates the targets.
// Metric `ttfb`: connect start to first response byte (connecting + sending
// + waiting); `http_req_waiting`: request sent to first byte.
//
//   K6_NO_USAGE_REPORT=true k6 run -e TARGET=http://127.0.0.1:6081 \
//     -e CONNS=100 -e REUSE=0 loadtests/k6/ttfb.js
import http from 'k6/http';
import { check } from 'k6';
import { Trend } from 'k6/metrics';
import { TREND_STATS, envInt, envStr, isHit, summarize, target } from './lib.js';

const URL = `${target()}${envStr('PATH_QS', '/static/177')}`;
const REUSE = envInt('REUSE', 0) === 1;
const ttfb = new Trend('ttfb', true);

export const options = {
  scenarios: {
    ttfb: {
      executor: 'shared-iterations',
      vus: 1,
      iterations: envInt('CONNS', 100),
      maxDuration: envStr('MAX_DURATION', '30s'),
    },
  },
  noConnectionReuse: !REUSE,
  discardResponseBodies: true,
  thresholds: {
    http_req_failed: ['rate<0.01'],
    // Every measured request must be a cache hit (the harness warms it).
    checks: ['rate>0.99'],
  },
  summaryTrendStats: TREND_STATS,
};

export default function () {
  const res = http.get(URL);
  ttfb.add(res.timings.connecting + res.timings.sending + res.timings.waiting);
  check(res, {
    'status 200': (r) => r.status === 200,
    'cache hit': (r) => isHit(r),
  });
}

export function handleSummary(data) {
  return summarize(data, ['ttfb', 'http_req_waiting', 'http_req_connecting', 'checks', 'http_req_failed']);
}
