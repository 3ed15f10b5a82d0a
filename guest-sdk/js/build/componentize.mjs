// ComponentizeJS's command line, with the glue it generates made cheaper
// per call (glue.mjs). Same arguments:
//
//   node guest-sdk/js/build/componentize.mjs policy.js -w guest-sdk/wit -n policy -o out.wasm
//
// ComponentizeJS calls its splicer to generate the glue, then snapshots the
// engine with it; the splicer's functions live on a plain object, so the
// wrapper below sees the glue between the two steps.
// The package's exports list neither file: import them by path. The splicer
// resolves to the module ComponentizeJS imports, so it sees the wrapper.
import { splicer } from '../node_modules/@bytecodealliance/componentize-js/lib/spidermonkey-embedding-splicer.js';

import { optimizeGlue } from './glue.mjs';

const spliceBindings = splicer.spliceBindings;
splicer.spliceBindings = (...args) => {
  const spliced = spliceBindings(...args);
  return { ...spliced, jsBindings: optimizeGlue(spliced.jsBindings) };
};

await import('../node_modules/@bytecodealliance/componentize-js/src/cli.js');
