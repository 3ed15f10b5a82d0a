declare module 'inlay:policy/types@0.1.0' {
  /**
   * A list of HTTP header fields, in order; names are lower-case.
   */
  export type Headers = Array<[string, string]>;
  /**
   * A complete response made by the policy (Varnish's `synth`).
   */
  export interface SyntheticResponse {
    /**
     * Status code.
     */
    status: number,
    /**
     * Header fields.
     */
    headers: Headers,
    /**
     * Body bytes.
     */
    body: Uint8Array,
  }
  /**
   * What to do with a request after `on-request`.
   */
  export type RequestAction = RequestActionLookup | RequestActionPass | RequestActionSynthetic;
  /**
   * Look the request up in the cache (the default for GET and HEAD).
   */
  export interface RequestActionLookup {
    tag: 'lookup',
  }
  /**
   * Go to the backend, do not use or fill the cache.
   */
  export interface RequestActionPass {
    tag: 'pass',
  }
  /**
   * Answer at once with this response; the backend is not contacted.
   */
  export interface RequestActionSynthetic {
    tag: 'synthetic',
    val: SyntheticResponse,
  }
  /**
   * How the host will store a backend response. The host fills it from
   * the response headers (RFC 9111, Surrogate-Control); the policy may
   * change any field in `on-backend-response`.
   */
  export interface CacheSettings {
    /**
     * Store the response at all.
     */
    cacheable: boolean,
    /**
     * Seconds the object is fresh.
     */
    ttl: number,
    /**
     * Seconds after expiry it may be served stale while one background
     * fetch refreshes it (stale-while-revalidate).
     */
    grace: number,
    /**
     * Seconds after ttl+grace it is kept for revalidation and
     * stale-if-error.
     */
    keep: number,
    /**
     * Surrogate keys for purging by key.
     */
    surrogateKeys: Array<string>,
    /**
     * Process the body as ESI.
     */
    esi: boolean,
  }
  
  export class Request implements Disposable {
    /**
     * This type does not have a public constructor.
     */
    private constructor();
    /**
    * The method, for example `GET`.
    */
    method(): string;
    /**
    * Replace the method.
    */
    setMethod(method: string): void;
    /**
    * The path and query, for example `/a/b?c=d`.
    */
    url(): string;
    /**
    * Replace the path and query. Must start with `/`.
    */
    setUrl(url: string): void;
    /**
    * The first value of a header, if present (name is case-insensitive).
    */
    header(name: string): string | undefined;
    /**
    * Every value of a header, in order.
    */
    headerAll(name: string): Array<string>;
    /**
    * All header fields.
    */
    headers(): Headers;
    /**
    * Set a header, replacing any existing values.
    */
    setHeader(name: string, value: string): void;
    /**
    * Add a header value, keeping existing ones.
    */
    appendHeader(name: string, value: string): void;
    /**
    * Remove every value of a header.
    */
    removeHeader(name: string): void;
    /**
    * The client's IP address as text.
    */
    clientIp(): string;
    /**
    * The backend this request will go to (from the config).
    */
    backend(): string;
    /**
    * Choose a configured backend by name. Unknown names are refused.
    */
    setBackend(name: string): void;
    /**
    * Add data to the cache key (Varnish's `hash_data`).
    */
    addToCacheKey(data: string): void;
    [Symbol.dispose](): void;
  }
  
  export class Response implements Disposable {
    /**
     * This type does not have a public constructor.
     */
    private constructor();
    /**
    * The status code.
    */
    status(): number;
    /**
    * Replace the status code (100-999).
    */
    setStatus(status: number): void;
    /**
    * The first value of a header, if present (name is case-insensitive).
    */
    header(name: string): string | undefined;
    /**
    * Every value of a header, in order.
    */
    headerAll(name: string): Array<string>;
    /**
    * All header fields.
    */
    headers(): Headers;
    /**
    * Set a header, replacing any existing values.
    */
    setHeader(name: string, value: string): void;
    /**
    * Add a header value, keeping existing ones.
    */
    appendHeader(name: string, value: string): void;
    /**
    * Remove every value of a header.
    */
    removeHeader(name: string): void;
    [Symbol.dispose](): void;
  }
}
