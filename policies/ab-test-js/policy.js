// A sticky A/B test that still caches: the JavaScript port of
// policies/ab-test (same cookie, headers and cache key).
//
// The bucket comes from the cookie `inlay_ab` (`a` or `b`). A client
// without a valid cookie gets a bucket derived from a hash of its IP and
// `User-Agent`, and the cookie is set on delivery. The origin sees the
// bucket as `x-ab-bucket`; the bucket is added to the cache key. The
// `inlay_ab` cookie is removed from the request; other cookies still pass.

import {
  definePolicy,
  builtin,
  cookie,
  removeCookie,
  log,
  errorMessage,
} from '../../guest-sdk/js/src/index.js';

/** The cookie holding the bucket. */
export const COOKIE = 'inlay_ab';
/** The request header the origin reads the bucket from. */
export const BUCKET_HEADER = 'x-ab-bucket';
/** Marks a bucket assigned by this request, so onDeliver sets the cookie. */
export const NEW_BUCKET_HEADER = 'x-ab-new';
/** How long the cookie lives: 30 days. */
const COOKIE_MAX_AGE = 30 * 24 * 3600;

const FNV_OFFSET = 0xcbf29ce484222325n;
const FNV_PRIME = 0x100000001b3n;
const utf8 = new TextEncoder();

/** FNV-1a (64-bit) of IP, a zero byte and user agent; even hashes go to `a`. */
export function assignBucket(clientIp, userAgent) {
  let hash = FNV_OFFSET;
  const ip = utf8.encode(clientIp);
  const ua = utf8.encode(userAgent);
  const bytes = new Uint8Array(ip.length + 1 + ua.length);
  bytes.set(ip, 0);
  bytes.set(ua, ip.length + 1);
  for (const byte of bytes) {
    hash = BigInt.asUintN(64, (hash ^ BigInt(byte)) * FNV_PRIME);
  }
  return hash % 2n === 0n ? 'a' : 'b';
}

/** Set a request header whose value we built; log if the host refuses it. */
function set(req, name, value) {
  try {
    req.setHeader(name, value);
  } catch (err) {
    log.warn(`could not set ${name}: ${errorMessage(err)}`);
  }
}

export const handler = definePolicy({
  onRequest(req) {
    // Only this policy may set the marker, never the client.
    req.removeHeader(NEW_BUCKET_HEADER);
    let bucket = cookie(req, COOKIE);
    if (bucket !== 'a' && bucket !== 'b') {
      bucket = assignBucket(req.clientIp(), req.header('user-agent') ?? '');
      set(req, NEW_BUCKET_HEADER, '1');
    }
    removeCookie(req, COOKIE);
    set(req, BUCKET_HEADER, bucket);
    req.addToCacheKey(`ab=${bucket}`);
    return builtin.recv(req);
  },

  onDeliver(req, resp) {
    if (req.header(NEW_BUCKET_HEADER) === undefined) {
      return;
    }
    const bucket = req.header(BUCKET_HEADER);
    if (bucket === undefined) {
      return;
    }
    const value = `${COOKIE}=${bucket}; Path=/; Max-Age=${COOKIE_MAX_AGE}; SameSite=Lax`;
    try {
      resp.appendHeader('set-cookie', value);
    } catch (err) {
      log.warn(`could not set the A/B cookie: ${errorMessage(err)}`);
    }
  },
});
