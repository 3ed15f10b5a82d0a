/// <reference path="./inlay-policy-types.d.ts" />
declare module 'inlay:policy/fetch@0.1.0' {
  /**
   * One subrequest.
   */
  export function send(req: FetchRequest): FetchResponse;
  /**
   * Several subrequests at once, in parallel; results in the same order.
   */
  export function sendMany(reqs: Array<FetchRequest>): Array<Result<FetchResponse, FetchError>>;
  export type Headers = import('inlay:policy/types@0.1.0').Headers;
  /**
   * A subrequest.
   */
  export interface FetchRequest {
    /**
     * Backend name from the config; none means the request's backend.
     */
    backend?: string,
    /**
     * Method (GET if empty).
     */
    method: string,
    /**
     * Path and query, starting with `/`.
     */
    url: string,
    /**
     * Header fields to send.
     */
    headers: Headers,
    /**
     * Request body.
     */
    body: Uint8Array,
  }
  /**
   * A subrequest's response.
   */
  export interface FetchResponse {
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
  }
  /**
   * Why a subrequest failed.
   */
  export type FetchError = FetchErrorUnknownBackend | FetchErrorInvalidRequest | FetchErrorConnectFailed | FetchErrorTimeout | FetchErrorBodyTooLarge | FetchErrorLimitExceeded;
  /**
   * No backend of that name is configured.
   */
  export interface FetchErrorUnknownBackend {
    tag: 'unknown-backend',
    val: string,
  }
  /**
   * The request was malformed.
   */
  export interface FetchErrorInvalidRequest {
    tag: 'invalid-request',
    val: string,
  }
  /**
   * Connecting to the backend failed.
   */
  export interface FetchErrorConnectFailed {
    tag: 'connect-failed',
    val: string,
  }
  /**
   * The backend did not answer in time.
   */
  export interface FetchErrorTimeout {
    tag: 'timeout',
  }
  /**
   * The body was larger than the host allows a policy to buffer.
   */
  export interface FetchErrorBodyTooLarge {
    tag: 'body-too-large',
  }
  /**
   * The per-request cap on subrequests was reached.
   */
  export interface FetchErrorLimitExceeded {
    tag: 'limit-exceeded',
  }
  export type Result<T, E> = { tag: 'ok', val: T } | { tag: 'err', val: E };
}
