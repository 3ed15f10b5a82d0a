// Header hygiene, the JavaScript port of policies/headers (same behaviour):
// strips tracking query parameters (`utm_*`, `fbclid`, `gclid`) before the
// cache lookup, so they do not split the cache or reach the origin; on
// delivery removes `Server` and `X-Powered-By` and adds
// `x-inlay-policy: headers`.

import { definePolicy, builtin, log, errorMessage } from '../../guest-sdk/js/src/index.js';

/**
 * Whether a query parameter name is a tracking parameter (any ASCII case).
 * `toLowerCase` also lowers non-ASCII letters, but none of them lowers to
 * text these names could match, so this agrees with the Rust policy's
 * ASCII-only lowering (and costs a native call, not a regex callback per
 * capital).
 */
function isTracking(name) {
  const lower = name.toLowerCase();
  return lower.startsWith('utm_') || lower === 'fbclid' || lower === 'gclid';
}

/** The name part of a `name=value` query parameter. */
function paramName(param) {
  const eq = param.indexOf('=');
  return eq < 0 ? param : param.slice(0, eq);
}

/**
 * `url` without tracking query parameters, the others kept in order and
 * exact text; the `?` goes when none is left. Undefined when unchanged.
 */
export function stripTrackingParams(url) {
  const q = url.indexOf('?');
  if (q < 0) {
    return undefined;
  }
  const params = url.slice(q + 1).split('&');
  if (!params.some((param) => isTracking(paramName(param)))) {
    return undefined;
  }
  const kept = params.filter((param) => param !== '' && !isTracking(paramName(param)));
  return kept.length === 0 ? url.slice(0, q) : `${url.slice(0, q)}?${kept.join('&')}`;
}

export const handler = definePolicy({
  onRequest(req) {
    const clean = stripTrackingParams(req.url());
    if (clean !== undefined) {
      try {
        req.setUrl(clean);
      } catch (err) {
        // A sub-string of a valid URL: not expected; the original stays.
        log.warn(`could not strip tracking parameters: ${errorMessage(err)}`);
      }
    }
    return builtin.recv(req);
  },

  onDeliver(_req, resp) {
    resp.removeHeader('server');
    resp.removeHeader('x-powered-by');
    try {
      resp.setHeader('x-inlay-policy', 'headers');
    } catch (err) {
      log.warn(`could not set x-inlay-policy: ${errorMessage(err)}`);
    }
  },
});
