/// <reference path="./interfaces/inlay-policy-cache.d.ts" />
/// <reference path="./interfaces/inlay-policy-clock.d.ts" />
/// <reference path="./interfaces/inlay-policy-config.d.ts" />
/// <reference path="./interfaces/inlay-policy-esi.d.ts" />
/// <reference path="./interfaces/inlay-policy-fetch.d.ts" />
/// <reference path="./interfaces/inlay-policy-handler.d.ts" />
/// <reference path="./interfaces/inlay-policy-kv.d.ts" />
/// <reference path="./interfaces/inlay-policy-log.d.ts" />
/// <reference path="./interfaces/inlay-policy-sdk.d.ts" />
/// <reference path="./interfaces/inlay-policy-types.d.ts" />
declare module 'inlay:policy/policy@0.1.0' {
  export type * as InlayPolicyCache010 from 'inlay:policy/cache@0.1.0'; // import inlay:policy/cache@0.1.0
  export type * as InlayPolicyClock010 from 'inlay:policy/clock@0.1.0'; // import inlay:policy/clock@0.1.0
  export type * as InlayPolicyConfig010 from 'inlay:policy/config@0.1.0'; // import inlay:policy/config@0.1.0
  export type * as InlayPolicyEsi010 from 'inlay:policy/esi@0.1.0'; // import inlay:policy/esi@0.1.0
  export type * as InlayPolicyFetch010 from 'inlay:policy/fetch@0.1.0'; // import inlay:policy/fetch@0.1.0
  export type * as InlayPolicyKv010 from 'inlay:policy/kv@0.1.0'; // import inlay:policy/kv@0.1.0
  export type * as InlayPolicyLog010 from 'inlay:policy/log@0.1.0'; // import inlay:policy/log@0.1.0
  export type * as InlayPolicySdk010 from 'inlay:policy/sdk@0.1.0'; // import inlay:policy/sdk@0.1.0
  export type * as InlayPolicyTypes010 from 'inlay:policy/types@0.1.0'; // import inlay:policy/types@0.1.0
  export * as handler from 'inlay:policy/handler@0.1.0'; // export inlay:policy/handler@0.1.0
}
