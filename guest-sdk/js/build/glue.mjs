// Makes the JavaScript glue ComponentizeJS generates for the inlay:policy
// world cheaper per call, without changing what it does. The glue runs in
// StarlingMonkey's bytecode interpreter on every hook and every host call,
// so its overhead is most of a small policy's cost: for `headers-js`, 131 us
// per request before these rewrites, 90 us after (policy_call bench; the
// figures per rewrite are below).
//
// The rewrites are written against the glue of the pinned ComponentizeJS
// (package.json). Each must apply: if a new version generates other glue,
// the build stops with the name of the rewrite that no longer fits, rather
// than producing a slower component quietly.

/** One rewrite: `from` (a string, or a RegExp with the g flag) -> `to`. */
export const REWRITES = [
  {
    // The generated encoder counts the UTF-8 length in a JavaScript loop
    // over the string's code units, then encodes. TextEncoder.encode (native)
    // gives the same bytes (lone surrogates become U+FFFD, 3 bytes, in
    // both), so the copy into the guest's memory is the same. -12 us.
    name: 'utf8-encode-natively',
    from: `  let len = 0;
  let codepoints = 0;
  for (let i = 0; i < s.length; i++) {
    const ch = s.charCodeAt(i);
    codepoints++;
    if (ch < 0x80) { len += 1; }
    else if (ch < 0x800) { len += 2; }
    else if (ch >= 0xd800 && ch <= 0xdbff &&
    i + 1 < s.length &&
    (s.charCodeAt(i + 1) & 0xfc00) === 0xdc00) {
      len += 4;
      i++;
    } else { len += 3; }
  }
  const ptr = realloc(0, 0, 1, len);
  const { read, written } = TEXT_ENCODER_UTF8.encodeInto(
  s,
  new Uint8Array(memory.buffer, ptr, len),
  );
  if (read !== s.length || written !== len) {
    throw new Error('failed to encode whole string');
  }
  const res = { ptr, len, codepoints };
  return res;`,
    to: `  const bytes = TEXT_ENCODER_UTF8.encode(s);
  const len = bytes.length;
  const ptr = realloc(0, 0, 1, len);
  new Uint8Array(memory.buffer, ptr, len).set(bytes);
  return { ptr, len };`,
  },
  {
    // Trace calls around every host call and hook: each builds an object
    // and calls a function that returns at once unless
    // globalThis.process.env.JCO_DEBUG is set, and a component has no
    // \`process\`. The calls are removed; the definition stays. -17 us.
    name: 'drop-debug-log-calls',
    from: /_debugLog\((?:'[^']*'|[^()'])*\);/g,
    to: '',
  },
  {
    // A hook's result was always awaited, which suspends the export and
    // resumes it from the job queue even when the hook returned a plain
    // value (every hook of the SDK does). An async hook's promise is still
    // awaited. -6 us.
    name: 'await-only-promises',
    from: /ret = await (handler\w+)\(([^)]*)\);/g,
    to:
      "ret = $1($2);\n" +
      "    if (ret !== null && typeof ret === 'object' && typeof ret.then === 'function') { ret = await ret; }",
  },
  {
    // The resource handle was attached to each request and response object
    // with Object.defineProperty; a plain assignment of the same symbol-keyed
    // property is much cheaper in the interpreter. The property becomes
    // enumerable, which only Object.assign and spreads see (a copy is not a
    // resource: it has none of the methods). -7.5 us.
    name: 'plain-handle-property',
    from: /Object\.defineProperty\((rsc\d+), symbolRscHandle, \{ writable: true, value: (handle\d+)\}\);/g,
    to: '$1[symbolRscHandle] = $2;',
  },
];

/** `js` with every rewrite applied; throws if one does not apply. */
export function optimizeGlue(js, rewrites = REWRITES) {
  let out = js;
  for (const { name, from, to } of rewrites) {
    const found =
      typeof from === 'string' ? out.split(from).length - 1 : (out.match(from) ?? []).length;
    if (found === 0) {
      throw new Error(
        `ComponentizeJS's glue changed: the rewrite '${name}' no longer applies ` +
          `(guest-sdk/js/build/glue.mjs is written for the version pinned in package.json)`,
      );
    }
    out = typeof from === 'string' ? out.split(from).join(to) : out.replace(from, to);
  }
  return out;
}
