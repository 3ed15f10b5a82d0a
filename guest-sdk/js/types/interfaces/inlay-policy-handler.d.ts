/// <reference path="./inlay-policy-types.d.ts" />
declare module 'inlay:policy/handler@0.1.0' {
  /**
   * recv: inspect or rewrite the request, choose a backend, and decide
   * lookup, pass or a synthetic answer.
   */
  export function onRequest(req: Request): RequestAction;
  /**
   * The backend answered: inspect or edit its headers and status, and
   * decide how it is cached. `settings` holds the host's defaults.
   */
  export function onBackendResponse(req: Request, resp: Response, settings: CacheSettings): CacheSettings;
  /**
   * The response is about to be delivered (from cache or backend):
   * edit its status and headers.
   */
  export function onDeliver(req: Request, resp: Response): void;
  export type Request = import('inlay:policy/types@0.1.0').Request;
  export type Response = import('inlay:policy/types@0.1.0').Response;
  export type RequestAction = import('inlay:policy/types@0.1.0').RequestAction;
  export type CacheSettings = import('inlay:policy/types@0.1.0').CacheSettings;
}
