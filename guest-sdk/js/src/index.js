// The JavaScript SDK for Inlay policies: idiomatic helpers over the
// `inlay:policy/policy@0.1.0` world as ComponentizeJS binds it. Typings:
// index.d.ts beside this file; the raw world: ../types/.
//
//   import { definePolicy, builtin } from '../../guest-sdk/js/src/index.js';
//   export const handler = definePolicy({
//     onDeliver(req, resp) { resp.removeHeader('server'); },
//   });
//
// Module top-level code runs once at build time (ComponentizeJS snapshots
// the initialised engine with Wizer), when no host is there: call host
// imports (config, log, clock, ...) from hooks only.

import * as logImport from 'inlay:policy/log@0.1.0';
import * as configImport from 'inlay:policy/config@0.1.0';
import * as clockImport from 'inlay:policy/clock@0.1.0';
import * as cacheImport from 'inlay:policy/cache@0.1.0';
import * as kvImport from 'inlay:policy/kv@0.1.0';
import * as fetchImport from 'inlay:policy/fetch@0.1.0';
import * as esiImport from 'inlay:policy/esi@0.1.0';
import * as sdkImport from 'inlay:policy/sdk@0.1.0';

/** Log lines, written by the host's logger with the policy's name. */
export const log = Object.freeze({
  write: (level, message) => logImport.write(level, String(message)),
  trace: (message) => logImport.write('trace', String(message)),
  debug: (message) => logImport.write('debug', String(message)),
  info: (message) => logImport.write('info', String(message)),
  warn: (message) => logImport.write('warn', String(message)),
  error: (message) => logImport.write('error', String(message)),
});

/** The policy's own settings (`[policy.config]` in the host config). */
export const config = Object.freeze({
  get: (key) => configImport.get(key),
  all: () => new Map(configImport.all()),
});

/** The host's wall clock (policies get no WASI clocks). */
export const clock = Object.freeze({
  nowUnixMs: () => Number(clockImport.nowUnixMs()),
});

// The remaining capabilities are thin already: re-exported as bound.
export const cache = cacheImport;
export const kv = kvImport;
export const fetch = fetchImport;
export const esi = esiImport;

const utf8 = new TextEncoder();

/** Header pairs from an array of pairs or a plain object, names lower-cased. */
function headerPairs(headers) {
  const entries = Array.isArray(headers) ? headers : Object.entries(headers ?? {});
  return entries.map(([name, value]) => [String(name).toLowerCase(), String(value)]);
}

/** What `onRequest` returns. */
export const Action = Object.freeze({
  /** Look the request up in the cache. */
  lookup: Object.freeze({ tag: 'lookup' }),
  /** Go to the backend; do not use or fill the cache. */
  pass: Object.freeze({ tag: 'pass' }),
  /** Answer at once; `body` is a string (UTF-8) or a Uint8Array. */
  synthetic(status, { headers = [], body = '' } = {}) {
    const bytes = typeof body === 'string' ? utf8.encode(body) : body;
    if (!(bytes instanceof Uint8Array)) {
      throw new TypeError('synthetic body must be a string or a Uint8Array');
    }
    return { tag: 'synthetic', val: { status, headers: headerPairs(headers), body: bytes } };
  },
  /** A redirect answered at the edge, with `Location` and an empty body. */
  redirect(status, location) {
    return Action.synthetic(status, { headers: [['location', location]] });
  },
});

/** Varnish's built-in behaviour, which the hooks of `definePolicy` default to. */
export const builtin = Object.freeze({
  /**
   * `pass` for methods other than GET/HEAD and for credentials, else
   * `lookup`: the host decides it in one call (the rules of
   * `isLookupMethod` and `hasCredentials`).
   */
  recv(req) {
    return sdkImport.builtinRecvLookup(req) ? Action.lookup : Action.pass;
  },
  /** GET and HEAD are looked up (methods are case-sensitive). */
  isLookupMethod: (method) => method === 'GET' || method === 'HEAD',
  /** Whether the request has an `Authorization` or `Cookie` header. */
  hasCredentials: (req) =>
    req.header('authorization') !== undefined || req.header('cookie') !== undefined,
  /** Keep the host's cache settings (it applied RFC 9111 already). */
  backendResponse: (_req, _resp, settings) => settings,
  /** Change nothing. */
  deliver: (_req, _resp) => {},
});

// Unicode White_Space, as Rust's `str::trim` (JS's own trim differs on
// U+0085 and U+FEFF), so cookies parse the same in every SDK.
const EDGE_SPACE = /^[\t\n\v\f\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+|[\t\n\v\f\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+$/g;

/** `s` without leading and trailing Unicode white space. */
function trim(s) {
  return s.replace(EDGE_SPACE, '');
}

/** The non-empty, trimmed `name=value` pieces of one `Cookie` line. */
function cookiePairs(line) {
  return line.split(';').map(trim).filter((pair) => pair !== '');
}

/** The name of one cookie piece (the whole piece if it has no `=`). */
function cookieName(pair) {
  const eq = pair.indexOf('=');
  return eq < 0 ? pair : trim(pair.slice(0, eq));
}

/** The value of the first cookie called `name`, or undefined. */
export function cookie(req, name) {
  for (const line of req.headerAll('cookie')) {
    for (const pair of cookiePairs(line)) {
      if (cookieName(pair) === name) {
        const eq = pair.indexOf('=');
        return eq < 0 ? '' : trim(pair.slice(eq + 1));
      }
    }
  }
  return undefined;
}

/**
 * Remove every cookie called `name` from the request, keeping the others in
 * order in one `Cookie` line; the header goes when none is left. Returns
 * whether the cookie was there.
 */
export function removeCookie(req, name) {
  const kept = [];
  let found = false;
  for (const line of req.headerAll('cookie')) {
    for (const pair of cookiePairs(line)) {
      if (cookieName(pair) === name) {
        found = true;
      } else {
        kept.push(pair);
      }
    }
  }
  if (found) {
    if (kept.length === 0) {
      req.removeHeader('cookie');
    } else {
      try {
        req.setHeader('cookie', kept.join('; '));
      } catch {
        // The pieces came from a valid header; drop it rather than keep the cookie.
        req.removeHeader('cookie');
      }
    }
  }
  return found;
}

/** The path of a request URL (before the first `?`). */
export function path(req) {
  const url = req.url();
  const q = url.indexOf('?');
  return q < 0 ? url : url.slice(0, q);
}

/** The query of a request URL (after the first `?`), or undefined. */
export function query(req) {
  const url = req.url();
  const q = url.indexOf('?');
  return q < 0 ? undefined : url.slice(q + 1);
}

/** The message of a host error (`result` errors arrive as thrown values). */
export function errorMessage(err) {
  if (err && typeof err === 'object' && 'payload' in err) {
    return String(err.payload);
  }
  return err instanceof Error ? err.message : String(err);
}

/** Run a hook; log what it threw, then rethrow so the host fails the request. */
function guarded(name, hook) {
  // Hooks take at most three arguments; a fixed arity avoids the rest and
  // spread arrays, which cost in the interpreter on every call.
  return (a, b, c) => {
    try {
      return hook(a, b, c);
    } catch (err) {
      log.error(`policy ${name} threw: ${errorMessage(err)}`);
      throw err;
    }
  };
}

/**
 * A hook you did not write: `builtin`'s rules, after telling the host (once
 * is enough) that it may apply them itself and skip the instance.
 */
function defaultHook(name, rules) {
  return (a, b, c) => {
    sdkImport.defaultHook(name);
    return rules(a, b, c);
  };
}

/**
 * The `handler` export from the hooks you write; missing hooks behave like
 * Varnish's built-in VCL (`builtin`), and cost nothing: the host applies
 * those rules itself once it has seen the default run. Export the result as
 * `handler`.
 */
export function definePolicy(hooks) {
  return {
    onRequest: guarded('onRequest', hooks.onRequest ?? defaultHook('on-request', builtin.recv)),
    onBackendResponse: guarded(
      'onBackendResponse',
      hooks.onBackendResponse ?? defaultHook('on-backend-response', builtin.backendResponse),
    ),
    onDeliver: guarded('onDeliver', hooks.onDeliver ?? defaultHook('on-deliver', builtin.deliver)),
  };
}
