declare module 'inlay:policy/esi@0.1.0' {
  /**
   * Turn ESI processing of the current response on or off (overrides
   * the origin's Surrogate-Control opt-in).
   */
  export function setEnabled(enabled: boolean): void;
  /**
   * Set an ESI variable, readable as `$(name)` in the page.
   */
  export function setVar(name: string, value: string): void;
}
