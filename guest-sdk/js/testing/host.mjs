// An in-memory Inlay host for tests, with the same rules as the real one
// (header names are tokens, values have no control characters, URLs start
// with `/`). It backs both ways of testing a policy:
//
// - natively: `node --import <sdk>/testing/register.mjs --test` resolves the
//   `inlay:policy/*` imports of the policy source to this host;
// - as a built component: `loadComponent` in component.mjs (any language).

/** A `result` error from the host, as ComponentizeJS and jco carry it. */
export class HostError extends Error {
  constructor(message) {
    super(message);
    this.payload = message;
  }
}

const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;

function parseName(name) {
  if (!TOKEN.test(name)) {
    throw new HostError(`invalid header name ${JSON.stringify(name)}`);
  }
  return name.toLowerCase();
}

function checkValue(name, value) {
  // HTTP's HeaderValue: visible ASCII, space, tab and obs-text; no CR, LF, NUL, DEL.
  if (/[\x00-\x08\x0a-\x1f\x7f]/.test(value)) {
    throw new HostError(`invalid value for header ${JSON.stringify(name)}`);
  }
  return value;
}

/** Ordered header fields with the host's accessors; names are lower-case. */
class HeaderList {
  constructor(fields = []) {
    this.fields = fields.map(([n, v]) => [parseName(n), checkValue(n, v)]);
  }
  first(name) {
    const lower = name.toLowerCase();
    return this.fields.find(([n]) => n === lower)?.[1];
  }
  all(name) {
    const lower = name.toLowerCase();
    return this.fields.filter(([n]) => n === lower).map(([, v]) => v);
  }
  set(name, value) {
    checkValue(name, value);
    const lower = parseName(name);
    const at = this.fields.findIndex(([n]) => n === lower);
    this.fields = this.fields.filter(([n]) => n !== lower);
    this.fields.splice(at < 0 ? this.fields.length : at, 0, [lower, value]);
  }
  append(name, value) {
    checkValue(name, value);
    this.fields.push([parseName(name), value]);
  }
  remove(name) {
    const lower = name.toLowerCase();
    this.fields = this.fields.filter(([n]) => n !== lower);
  }
  list() {
    return this.fields.map(([n, v]) => [n, v]);
  }
}

/** The client's request (the `request` resource). */
export class Request {
  constructor({
    method = 'GET',
    url = '/',
    headers = [],
    clientIp = '127.0.0.1',
    backend = 'default',
    backends = ['default'],
  } = {}) {
    this._method = method;
    this._url = url;
    this._headers = new HeaderList(headers);
    this._clientIp = clientIp;
    this._backend = backend;
    this._backends = backends;
    /** What the policy added with addToCacheKey, in order. */
    this.cacheKeyData = [];
  }
  method() { return this._method; }
  setMethod(method) { this._method = method; }
  url() { return this._url; }
  setUrl(url) {
    if (!url.startsWith('/')) {
      throw new HostError(`url must start with \`/\`: ${JSON.stringify(url)}`);
    }
    if (/[\x00-\x20\x7f"<>\\^`{|}]/.test(url)) {
      throw new HostError(`invalid url ${JSON.stringify(url)}`);
    }
    this._url = url;
  }
  header(name) { return this._headers.first(name); }
  headerAll(name) { return this._headers.all(name); }
  headers() { return this._headers.list(); }
  setHeader(name, value) { this._headers.set(name, value); }
  appendHeader(name, value) { this._headers.append(name, value); }
  removeHeader(name) { this._headers.remove(name); }
  clientIp() { return this._clientIp; }
  backend() { return this._backend; }
  setBackend(name) {
    if (!this._backends.includes(name)) {
      throw new HostError(`unknown backend ${JSON.stringify(name)}`);
    }
    this._backend = name;
  }
  addToCacheKey(data) { this.cacheKeyData.push(data); }
}

/** A backend or delivered response (the `response` resource). */
export class Response {
  constructor({ status = 200, headers = [] } = {}) {
    this._status = status;
    this._headers = new HeaderList(headers);
  }
  status() { return this._status; }
  setStatus(status) {
    if (!Number.isInteger(status) || status < 100 || status > 999) {
      throw new HostError(`invalid status ${status}: must be 100-999`);
    }
    this._status = status;
  }
  header(name) { return this._headers.first(name); }
  headerAll(name) { return this._headers.all(name); }
  headers() { return this._headers.list(); }
  setHeader(name, value) { this._headers.set(name, value); }
  appendHeader(name, value) { this._headers.append(name, value); }
  removeHeader(name) { this._headers.remove(name); }
}

/** What the capabilities see and record; `reset()` between tests. */
export const host = {
  /** Log lines as `{ level, message }`. */
  logs: [],
  /** The policy's config. */
  config: new Map(),
  /** The clock, in milliseconds since the epoch. */
  nowMs: 1_700_000_000_000,
  /** The kv store. */
  kv: new Map(),
  /** ESI calls as `['set-enabled', bool]` / `['set-var', name, value]`. */
  esi: [],
  /** The hooks whose SDK default ran (`'on-request'`, ...), each once. */
  defaultHooks: [],
  reset() {
    this.logs = [];
    this.config = new Map();
    this.nowMs = 1_700_000_000_000;
    this.kv = new Map();
    this.esi = [];
    this.defaultHooks = [];
  },
};

/** The imported interfaces, keyed as the component names them. */
export const interfaces = {
  types: { Request, Response },
  log: {
    write(level, message) {
      host.logs.push({ level, message });
    },
  },
  config: {
    get: (key) => host.config.get(key),
    all: () => [...host.config.entries()],
  },
  clock: {
    nowUnixMs: () => BigInt(host.nowMs),
  },
  kv: {
    get: (key) => host.kv.get(key),
    set: (key, value) => { host.kv.set(key, Uint8Array.from(value)); },
    delete: (key) => host.kv.delete(key),
  },
  cache: {
    lookup: () => undefined,
    insert: () => {},
    purgeUrl: () => 0,
    purgeKey: () => 0,
  },
  fetch: {
    send: (req) => {
      throw new HostError({ tag: 'unknown-backend', val: req.backend ?? 'default' });
    },
    sendMany: (reqs) =>
      reqs.map((req) => ({ tag: 'err', val: { tag: 'unknown-backend', val: req.backend ?? 'default' } })),
  },
  esi: {
    setEnabled: (enabled) => { host.esi.push(['set-enabled', enabled]); },
    setVar: (name, value) => { host.esi.push(['set-var', name, value]); },
  },
  sdk: {
    defaultHook: (hook) => {
      if (!host.defaultHooks.includes(hook)) {
        host.defaultHooks.push(hook);
      }
    },
    // The host's built-in recv decision (Inlay's `RequestHead::builtin_lookup`).
    builtinRecvLookup: (req) =>
      (req.method() === 'GET' || req.method() === 'HEAD') &&
      req.header('authorization') === undefined &&
      req.header('cookie') === undefined,
  },
};
