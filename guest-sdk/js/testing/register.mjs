// `node --import <sdk>/testing/register.mjs --test ...`: resolve the
// `inlay:policy/<interface>@0.1.0` imports of policy sources to the
// in-memory host (host.mjs), so a policy is unit-tested without building it.
import { register } from 'node:module';

register('./resolve-hooks.mjs', import.meta.url);
