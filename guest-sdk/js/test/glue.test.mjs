// The rewrites of ComponentizeJS's generated glue (build/glue.mjs): each
// applies to the glue the pinned version generates for the inlay:policy
// world, and the rewritten string encoder writes the same bytes as the
// generated one. (The rewritten glue runs in every JavaScript component
// the conformance tests and the host's integration tests load.)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';

import { splicer } from '../node_modules/@bytecodealliance/componentize-js/lib/spidermonkey-embedding-splicer.js';
import { REWRITES, optimizeGlue } from '../build/glue.mjs';

const here = (path) => fileURLToPath(new URL(path, import.meta.url));

/** The glue ComponentizeJS generates for the policy world (no WASI features). */
async function generatedGlue() {
  const engine = await readFile(
    here('../node_modules/@bytecodealliance/componentize-js/lib/starlingmonkey_embedding.wasm'),
  );
  return splicer.spliceBindings(engine, [], undefined, here('../../wit'), 'policy', false).jsBindings;
}

const glue = await generatedGlue();

/** The glue's `_utf8AllocateAndEncode` from `js`, as a function. */
function encoderOf(js) {
  const start = js.indexOf('function _utf8AllocateAndEncode(');
  const end = js.indexOf('\n}\n', start) + 2;
  assert.ok(start >= 0 && end > start, 'the glue has the encoder');
  return new Function(
    'TEXT_ENCODER_UTF8',
    `${js.slice(start, end)}\nreturn _utf8AllocateAndEncode;`,
  )(new TextEncoder());
}

test('every rewrite applies to the pinned glue', () => {
  for (const rewrite of REWRITES) {
    assert.doesNotThrow(() => optimizeGlue(glue, [rewrite]), rewrite.name);
  }
  const optimized = optimizeGlue(glue);
  assert.doesNotMatch(optimized, /_debugLog\(/, 'no trace call is left');
  assert.match(optimized, /const _debugLog = /, 'the definition stays');
  assert.doesNotMatch(optimized, /await handler/);
  assert.doesNotMatch(optimized, /Object\.defineProperty\(rsc/);
});

test('a rewrite that does not apply stops the build', () => {
  assert.throws(
    () => optimizeGlue('let x = 1;', [{ name: 'missing', from: 'nothing', to: '' }]),
    /rewrite 'missing' no longer applies/,
  );
});

test('the rewritten encoder writes the bytes the generated one writes', () => {
  const before = encoderOf(glue);
  const after = encoderOf(optimizeGlue(glue));
  const samples = [
    'x-inlay-policy',
    '/articles/42?page=2&utm_source=news',
    'café €5 — ünïcødé',
    'emoji 😀 and 𝄞',
    'lone high \ud800 surrogate',
    'lone low \udc00 surrogate',
    'ends high \ud83d',
    '\u0000nul',
    'a'.repeat(5000),
  ];
  for (const s of samples) {
    const run = (encode) => {
      const memory = { buffer: new ArrayBuffer(1 << 16) };
      let next = 8;
      const realloc = (_old, _oldLen, _align, len) => {
        const ptr = next;
        next += len;
        return ptr;
      };
      const { ptr, len } = encode(s, realloc, memory);
      return Array.from(new Uint8Array(memory.buffer, ptr, len));
    };
    assert.deepEqual(run(after), run(before), JSON.stringify(s));
  }
  assert.deepEqual(after('', null, null), { ptr: 1, len: 0 }, 'empty strings allocate nothing');
  assert.throws(() => after(7, null, null), TypeError);
});
