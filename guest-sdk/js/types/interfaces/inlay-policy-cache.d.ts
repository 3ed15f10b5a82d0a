/// <reference path="./inlay-policy-types.d.ts" />
declare module 'inlay:policy/cache@0.1.0' {
  /**
   * Look up an object by host and path+query. Only fresh or in-grace
   * objects are returned.
   */
  export function lookup(host: string, url: string): CachedObject | undefined;
  /**
   * Insert or replace an object under host and path+query.
   */
  export function insert(host: string, url: string, obj: NewObject): void;
  /**
   * Purge one URL (all its variants). `soft` marks it stale instead of
   * removing it. Returns how many objects were affected.
   */
  export function purgeUrl(host: string, url: string, soft: boolean): number;
  /**
   * Purge every object tagged with a surrogate key.
   */
  export function purgeKey(key: string, soft: boolean): number;
  export type Headers = import('inlay:policy/types@0.1.0').Headers;
  /**
   * A cached object as seen by a policy.
   */
  export interface CachedObject {
    /**
     * Status code.
     */
    status: number,
    /**
     * Stored header fields.
     */
    headers: Headers,
    /**
     * The body.
     */
    body: Uint8Array,
    /**
     * Seconds since it was stored.
     */
    age: number,
    /**
     * Seconds of freshness left (0 when stale).
     */
    ttlLeft: number,
  }
  /**
   * An object to insert.
   */
  export interface NewObject {
    /**
     * Status code.
     */
    status: number,
    /**
     * Header fields.
     */
    headers: Headers,
    /**
     * The body.
     */
    body: Uint8Array,
    /**
     * Seconds fresh.
     */
    ttl: number,
    /**
     * Seconds of grace after expiry.
     */
    grace: number,
    /**
     * Surrogate keys.
     */
    surrogateKeys: Array<string>,
  }
  /**
   * Why a cache call failed.
   */
  export type CacheError = CacheErrorStorage | CacheErrorInvalid | CacheErrorLimitExceeded;
  /**
   * The storage refused the write (full, I/O error).
   */
  export interface CacheErrorStorage {
    tag: 'storage',
    val: string,
  }
  /**
   * The arguments were invalid (empty key, bad URL).
   */
  export interface CacheErrorInvalid {
    tag: 'invalid',
    val: string,
  }
  /**
   * The per-request cap on host calls was reached.
   */
  export interface CacheErrorLimitExceeded {
    tag: 'limit-exceeded',
  }
}
