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
