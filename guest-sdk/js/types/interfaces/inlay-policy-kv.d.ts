declare module 'inlay:policy/kv@0.1.0' {
  /**
   * Read a value.
   */
  export function get(key: string): Uint8Array | undefined;
  /**
   * Write a value.
   */
  export function set(key: string, value: Uint8Array): void;
  /**
   * Delete a value; returns whether it existed.
   */
  export { _delete as delete };
  function _delete(key: string): boolean;
  /**
   * Why a kv call failed.
   */
  export type KvError = KvErrorStorage | KvErrorTooLarge | KvErrorLimitExceeded;
  /**
   * The storage refused the operation.
   */
  export interface KvErrorStorage {
    tag: 'storage',
    val: string,
  }
  /**
   * The key or value is too large.
   */
  export interface KvErrorTooLarge {
    tag: 'too-large',
  }
  /**
   * The per-request cap on host calls was reached.
   */
  export interface KvErrorLimitExceeded {
    tag: 'limit-exceeded',
  }
}
