// Module resolution hooks installed by register.mjs.
const WIT = /^inlay:policy\/([a-z-]+)@0\.1\.0$/;
const KNOWN = new Set(['types', 'log', 'config', 'clock', 'kv', 'cache', 'fetch', 'esi', 'sdk']);

export async function resolve(specifier, context, nextResolve) {
  const match = WIT.exec(specifier);
  if (match && KNOWN.has(match[1])) {
    return { url: new URL(`./wit/${match[1]}.mjs`, import.meta.url).href, shortCircuit: true };
  }
  return nextResolve(specifier, context);
}
