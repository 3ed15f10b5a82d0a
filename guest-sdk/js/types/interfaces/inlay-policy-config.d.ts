declare module 'inlay:policy/config@0.1.0' {
  /**
   * One setting, if present.
   */
  export function get(key: string): string | undefined;
  /**
   * Every setting.
   */
  export function all(): Array<[string, string]>;
}
