// The built `headers` and `ab-test` components of every language must behave
// exactly like the Rust ones: the same cases run against each
// target/policies/<name><suffix>.wasm that exists (suffixes '', -js, -py,
// -go, -c; INLAY_POLICY_SUFFIXES="-js,-py" picks some), in node via jco.
//
//   make policies && policies/build-lang.sh && cd guest-sdk/js && npm test
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';

import { loadComponent } from '../testing/component.mjs';
import { Request, Response, host } from '../testing/host.mjs';

const ROOT = fileURLToPath(new URL('../../../', import.meta.url));
const OUT = join(ROOT, 'target', 'policies');
const SUFFIXES = (process.env.INLAY_POLICY_SUFFIXES ?? ',-js,-py,-go,-c').split(',');
const REQUIRED = process.env.INLAY_POLICY_SUFFIXES !== undefined;

/** [suffix, path] of the components of one policy to test. */
function components(policy) {
  return SUFFIXES.map((suffix) => [suffix, join(OUT, `${policy}${suffix}.wasm`)]).filter(
    ([, path]) => REQUIRED || existsSync(path),
  );
}

/** The reference bucket: FNV-1a 64 of ip, 0, ua; even hashes are `a`. */
function referenceBucket(ip, ua) {
  let hash = 0xcbf29ce484222325n;
  for (const byte of [...Buffer.from(ip), 0, ...Buffer.from(ua)]) {
    hash = BigInt.asUintN(64, (hash ^ BigInt(byte)) * 0x100000001b3n);
  }
  return hash % 2n === 0n ? 'a' : 'b';
}

const SETTINGS = { cacheable: true, ttl: 120, grace: 10, keep: 5, surrogateKeys: ['k1', 'k2'], esi: true };

for (const [suffix, path] of components('headers')) {
  test(`headers${suffix}`, async (t) => {
    const policy = await loadComponent(path);
    host.reset();

    await t.test('tracking parameters are stripped, others keep order', () => {
      const cases = [
        ['/p?b=2&utm_source=x&a=1&fbclid=y&UTM_Medium=z&gclid=q&c', '/p?b=2&a=1&c'],
        ['/p?utm_source=x&gclid=1', '/p'],
        ['/p?utm_campaign', '/p'],
        ['/a?utm_source=news&id=3', '/a?id=3'],
        ['/p?a=1&&utm_x=1&&b', '/p?a=1&b'],
        ['/p?Gclid=1&FBCLID=2&x=%20', '/p?x=%20'],
      ];
      for (const [url, want] of cases) {
        const req = new Request({ url });
        assert.deepEqual(policy.onRequest(req), { tag: 'lookup' }, url);
        assert.equal(req.url(), want, url);
      }
    });

    await t.test('urls without tracking parameters are unchanged', () => {
      for (const url of ['/', '/p?', '/p?a=1&&b=2', '/p?utm=1&fbclidx=2&xgclid=3', '/p?a=utm_x']) {
        const req = new Request({ url });
        policy.onRequest(req);
        assert.equal(req.url(), url);
      }
    });

    await t.test('built-in rules after the rewrite', () => {
      const post = new Request({ method: 'POST', url: '/a?fbclid=1' });
      assert.deepEqual(policy.onRequest(post), { tag: 'pass' });
      assert.equal(post.url(), '/a');
      const cookie = new Request({ headers: [['cookie', 's=1']] });
      assert.deepEqual(policy.onRequest(cookie), { tag: 'pass' });
      const auth = new Request({ headers: [['authorization', 'Basic x']] });
      assert.deepEqual(policy.onRequest(auth), { tag: 'pass' });
      assert.deepEqual(policy.onRequest(new Request({ method: 'HEAD' })), { tag: 'lookup' });
      assert.deepEqual(policy.onRequest(new Request({ method: 'get' })), { tag: 'pass' });
    });

    await t.test('backend responses keep the host settings', () => {
      const got = policy.onBackendResponse(new Request(), new Response(), SETTINGS);
      assert.deepEqual(got, SETTINGS);
    });

    await t.test('deliver hides server details and marks the response', () => {
      const resp = new Response({
        headers: [
          ['Server', 'nginx/1.25'],
          ['X-Powered-By', 'PHP/8'],
          ['Content-Type', 'text/html'],
          ['x-inlay-policy', 'old'],
        ],
      });
      policy.onDeliver(new Request(), resp);
      assert.deepEqual(resp.headers(), [
        ['content-type', 'text/html'],
        ['x-inlay-policy', 'headers'],
      ]);
    });

    assert.deepEqual(host.logs, [], 'no log lines');
  });
}

for (const [suffix, path] of components('ab-test')) {
  test(`ab-test${suffix}`, async (t) => {
    const policy = await loadComponent(path);
    host.reset();

    const request = (cookie, ip = '192.0.2.1', ua = 'ua', extra = []) =>
      new Request({
        clientIp: ip,
        headers: [['user-agent', ua], ...(cookie === undefined ? [] : [['cookie', cookie]]), ...extra],
      });

    await t.test('a cookie bucket is kept, cached per bucket and sent to the origin', () => {
      for (const bucket of ['a', 'b']) {
        const req = request(`inlay_ab=${bucket}`);
        assert.deepEqual(policy.onRequest(req), { tag: 'lookup' });
        assert.equal(req.header('x-ab-bucket'), bucket);
        assert.deepEqual(req.cacheKeyData, [`ab=${bucket}`]);
        assert.equal(req.header('cookie'), undefined);
        assert.equal(req.header('x-ab-new'), undefined);
        const resp = new Response();
        policy.onDeliver(req, resp);
        assert.equal(resp.header('set-cookie'), undefined);
      }
    });

    await t.test('other cookies still pass and keep their order', () => {
      const req = request(' session=xyz; inlay_ab=b ;theme=dark', '192.0.2.1', 'ua', [['cookie', 'c=3']]);
      assert.deepEqual(policy.onRequest(req), { tag: 'pass' });
      assert.deepEqual(req.headerAll('cookie'), ['session=xyz; theme=dark; c=3']);
      assert.equal(req.header('x-ab-bucket'), 'b');
    });

    await t.test('a new client gets a stable bucket and a cookie', () => {
      const req = request(undefined, '198.51.100.7', 'Firefox');
      assert.deepEqual(policy.onRequest(req), { tag: 'lookup' });
      const bucket = referenceBucket('198.51.100.7', 'Firefox');
      assert.equal(req.header('x-ab-bucket'), bucket);
      assert.equal(req.header('x-ab-new'), '1');
      assert.deepEqual(req.cacheKeyData, [`ab=${bucket}`]);
      const resp = new Response({ headers: [['set-cookie', 'other=1']] });
      policy.onDeliver(req, resp);
      assert.deepEqual(resp.headerAll('set-cookie'), [
        'other=1',
        `inlay_ab=${bucket}; Path=/; Max-Age=2592000; SameSite=Lax`,
      ]);
    });

    await t.test('buckets match the Rust hash for every client', () => {
      const uas = ['ua', '', 'Mozilla/5.0 (X11; Linux x86_64)', 'Ünïcødé ✓'];
      for (let i = 0; i < 64; i++) {
        const ip = `10.0.${i % 7}.${i}`;
        const ua = uas[i % uas.length];
        const req = request(undefined, ip, ua);
        policy.onRequest(req);
        assert.equal(req.header('x-ab-bucket'), referenceBucket(ip, ua), `${ip} ${ua}`);
      }
      const noUa = new Request({ clientIp: '203.0.113.5' });
      policy.onRequest(noUa);
      assert.equal(noUa.header('x-ab-bucket'), referenceBucket('203.0.113.5', ''));
    });

    await t.test('the client cannot fake the new-bucket marker', () => {
      const req = request('inlay_ab=a', '192.0.2.1', 'ua', [['x-ab-new', '1']]);
      policy.onRequest(req);
      assert.equal(req.header('x-ab-new'), undefined);
      const resp = new Response();
      policy.onDeliver(req, resp);
      assert.equal(resp.header('set-cookie'), undefined);
    });

    await t.test('an invalid cookie value is replaced', () => {
      for (const cookie of ['inlay_ab=zzz', 'inlay_ab=', 'inlay_ab', 'inlay_ab=A']) {
        const req = request(cookie, '192.0.2.9', 'ua');
        assert.deepEqual(policy.onRequest(req), { tag: 'lookup' }, cookie);
        assert.equal(req.header('cookie'), undefined);
        const resp = new Response();
        policy.onDeliver(req, resp);
        const bucket = referenceBucket('192.0.2.9', 'ua');
        assert.equal(resp.header('set-cookie'), `inlay_ab=${bucket}; Path=/; Max-Age=2592000; SameSite=Lax`);
      }
    });

    await t.test('cookie whitespace and the first of several', () => {
      const req = request('x=1;  inlay_ab = b ; inlay_ab=a');
      assert.deepEqual(policy.onRequest(req), { tag: 'pass' });
      assert.equal(req.header('x-ab-bucket'), 'b');
      assert.deepEqual(req.headerAll('cookie'), ['x=1']);
    });

    await t.test('cookies are trimmed of Unicode white space as Rust trims', () => {
      // Rust's str::trim: U+00A0, U+0085, U+3000, U+2003 are white space, U+FEFF is not.
      const req = request('\u00a0inlay_ab=b\u0085;x=1\ufeff; \u3000y=2\u2003');
      assert.deepEqual(policy.onRequest(req), { tag: 'pass' });
      assert.equal(req.header('x-ab-bucket'), 'b');
      assert.deepEqual(req.headerAll('cookie'), ['x=1\ufeff; y=2']);
    });

    await t.test('post still passes, with the bucket', () => {
      const req = new Request({ method: 'POST', headers: [['cookie', 'inlay_ab=a']] });
      assert.deepEqual(policy.onRequest(req), { tag: 'pass' });
      assert.equal(req.header('x-ab-bucket'), 'a');
    });

    await t.test('backend responses keep the host settings', () => {
      assert.deepEqual(policy.onBackendResponse(new Request(), new Response(), SETTINGS), SETTINGS);
    });

    assert.deepEqual(host.logs, [], 'no log lines');
  });
}
