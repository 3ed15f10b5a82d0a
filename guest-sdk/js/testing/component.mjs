// Load a built policy component (any language) into node with jco and run
// its hooks against the in-memory host (host.mjs):
//
//   const policy = await loadComponent('target/policies/headers-js.wasm');
//   const req = new Request({ url: '/?utm_source=x' });
//   policy.onRequest(req);
import { readFileSync } from 'node:fs';
import { mkdir, writeFile, readFile, stat } from 'node:fs/promises';
import { createHash } from 'node:crypto';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { transpile } from '@bytecodealliance/jco';

import { interfaces } from './host.mjs';

// Transpiled components, by content hash (INLAY_JCO_CACHE or the temp folder).
const CACHE = process.env.INLAY_JCO_CACHE ?? join(tmpdir(), 'inlay-jco');
const VERSION = '0.1.0';

/** The import object: every interface under both its versioned and bare name. */
function importObject() {
  const imports = {};
  for (const [name, impl] of Object.entries(interfaces)) {
    imports[`inlay:policy/${name}`] = impl;
    imports[`inlay:policy/${name}@${VERSION}`] = impl;
  }
  return imports;
}

/**
 * Transpile (cached by content hash) and instantiate a component; returns
 * its `handler` export: `{ onRequest, onBackendResponse, onDeliver }`.
 */
export async function loadComponent(path) {
  const bytes = await readFile(path);
  const hash = createHash('sha256').update(bytes).digest('hex').slice(0, 16);
  const dir = join(CACHE, hash);
  const entry = join(dir, 'policy.js');
  const done = await stat(entry).then(() => true, () => false);
  if (!done) {
    const { files } = await transpile(bytes, {
      name: 'policy',
      instantiation: 'sync',
      noWasiShim: true,
      quiet: true,
    });
    for (const [file, content] of Object.entries(files)) {
      const target = join(dir, file);
      await mkdir(dirname(target), { recursive: true });
      await writeFile(target, content);
    }
  }
  const module = await import(pathToFileURL(entry).href);
  const getCoreModule = (file) => new WebAssembly.Module(readFileSync(join(dir, file)));
  const exports = module.instantiate(getCoreModule, importObject());
  return exports.handler ?? exports['inlay:policy/handler@0.1.0'];
}
