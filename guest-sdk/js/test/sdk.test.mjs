// The SDK helpers and the JavaScript policies' sources, run natively: the
// `inlay:policy/*` imports resolve to the in-memory host (register.mjs,
// which `npm test` loads with --import).
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { Request, Response, host } from '../testing/host.mjs';
import {
  Action,
  builtin,
  clock,
  config,
  cookie,
  definePolicy,
  errorMessage,
  log,
  path,
  query,
  removeCookie,
} from '../src/index.js';
import { stripTrackingParams } from '../../../policies/headers-js/policy.js';
import { assignBucket } from '../../../policies/ab-test-js/policy.js';

test('actions', () => {
  assert.deepEqual(Action.lookup, { tag: 'lookup' });
  assert.deepEqual(Action.synthetic(403, { headers: { 'Content-Type': 'text/plain' }, body: 'no' }), {
    tag: 'synthetic',
    val: { status: 403, headers: [['content-type', 'text/plain']], body: new TextEncoder().encode('no') },
  });
  assert.deepEqual(Action.redirect(301, '/new').val.headers, [['location', '/new']]);
  assert.throws(() => Action.synthetic(200, { body: 42 }), TypeError);
});

test('builtin recv', () => {
  assert.equal(builtin.recv(new Request()), Action.lookup);
  assert.equal(builtin.recv(new Request({ method: 'POST' })), Action.pass);
  assert.equal(builtin.recv(new Request({ headers: [['Authorization', 'x']] })), Action.pass);
  assert.equal(builtin.recv(new Request({ headers: [['cookie', 'a=1']] })), Action.pass);
});

test('cookies are read and removed like the Rust SDK', () => {
  const req = new Request({ headers: [['cookie', 'a=1; inlay_ab=b'], ['cookie', 'c=3']] });
  assert.equal(cookie(req, 'inlay_ab'), 'b');
  assert.equal(cookie(req, 'c'), '3');
  assert.equal(cookie(req, 'zz'), undefined);
  assert.equal(removeCookie(req, 'inlay_ab'), true);
  assert.deepEqual(req.headerAll('cookie'), ['a=1; c=3']);
  assert.equal(removeCookie(req, 'inlay_ab'), false);
  assert.equal(removeCookie(req, 'a'), true);
  assert.equal(removeCookie(req, 'c'), true);
  assert.equal(req.header('cookie'), undefined);
  assert.equal(cookie(new Request({ headers: [['cookie', 'flag; x = y ']] }), 'flag'), '');
  assert.equal(cookie(new Request({ headers: [['cookie', 'flag; x = y ']] }), 'x'), 'y');
});

test('path and query split at the first question mark', () => {
  const req = new Request({ url: '/p?a=1?b' });
  assert.equal(path(req), '/p');
  assert.equal(query(req), 'a=1?b');
  assert.equal(query(new Request({ url: '/p' })), undefined);
});

test('capabilities reach the host', () => {
  host.reset();
  host.config.set('key', 'v');
  host.nowMs = 1234;
  log.warn('careful');
  assert.deepEqual(host.logs, [{ level: 'warn', message: 'careful' }]);
  assert.equal(config.get('key'), 'v');
  assert.deepEqual(config.all(), new Map([['key', 'v']]));
  assert.equal(clock.nowUnixMs(), 1234);
});

test('host errors surface as exceptions with their message', () => {
  const req = new Request();
  try {
    req.setUrl('no-slash');
    assert.fail('setUrl accepted a URL without /');
  } catch (err) {
    assert.match(errorMessage(err), /must start with/);
  }
});

test('definePolicy fills defaults and logs exceptions', () => {
  host.reset();
  const handler = definePolicy({
    onDeliver() {
      throw new Error('boom');
    },
  });
  assert.equal(handler.onRequest(new Request({ method: 'PUT' })), Action.pass);
  const settings = { cacheable: true, ttl: 1, grace: 0, keep: 0, surrogateKeys: [], esi: false };
  assert.equal(handler.onBackendResponse(new Request(), new Response(), settings), settings);
  assert.throws(() => handler.onDeliver(new Request(), new Response()), /boom/);
  assert.deepEqual(host.logs, [{ level: 'error', message: 'policy onDeliver threw: boom' }]);
});

test('only the hooks left to their default tell the host', () => {
  host.reset();
  const handler = definePolicy({
    // Written by the policy, even though it ends in the built-in rules.
    onRequest: (req) => builtin.recv(req),
  });
  handler.onRequest(new Request());
  assert.deepEqual(host.defaultHooks, []);
  handler.onDeliver(new Request(), new Response());
  const settings = { cacheable: true, ttl: 1, grace: 0, keep: 0, surrogateKeys: [], esi: false };
  handler.onBackendResponse(new Request(), new Response(), settings);
  assert.deepEqual(host.defaultHooks, ['on-deliver', 'on-backend-response']);
});

test('the ports keep the Rust helpers', () => {
  assert.equal(stripTrackingParams('/p?b=2&utm_source=x&a=1'), '/p?b=2&a=1');
  assert.equal(stripTrackingParams('/p?a=1'), undefined);
  // The exact Rust values are checked on the built components (conformance).
  const a = Array.from({ length: 200 }, (_, i) => assignBucket(`10.0.0.${i}`, 'ua')).filter((b) => b === 'a');
  assert.ok(a.length >= 60 && a.length <= 140, `${a.length} of 200 in bucket a`);
});
