declare module 'inlay:policy/clock@0.1.0' {
  /**
   * The current time in milliseconds since the Unix epoch (UTC).
   */
  export function nowUnixMs(): bigint;
}
