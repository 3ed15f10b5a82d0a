/// <reference path="./inlay-policy-types.d.ts" />
declare module 'inlay:policy/sdk@0.1.0' {
  /**
   * The SDK's default for `hook` is running: the policy does not
   * implement that hook, so it follows the built-in rules (the SDKs'
   * `builtin` helpers: recv looks up GET and HEAD without
   * `Authorization` or `Cookie` and passes the rest; backend-response
   * keeps the host's settings; deliver changes nothing). The host then
   * runs those rules itself, without an instance, for the requests
   * that follow. Called from the SDK's default only, never from a hook
   * the policy wrote, even one that ends in the built-in rules.
   */
  export function defaultHook(hook: Hook): void;
  /**
   * The built-in recv's decision for `req`: true to look it up (a `GET`
   * or `HEAD` without `Authorization` or `Cookie`), false to pass it.
   * The SDKs' `builtin` recv asks this instead of reading the method
   * and both headers itself: one host call instead of three.
   */
  export function builtinRecvLookup(req: Request): boolean;
  export type Request = import('inlay:policy/types@0.1.0').Request;
  /**
   * One of `handler`'s hooks.
   * # Variants
   * 
   * ## `"on-request"`
   * 
   * ## `"on-backend-response"`
   * 
   * ## `"on-deliver"`
   */
  export type Hook = 'on-request' | 'on-backend-response' | 'on-deliver';
}
