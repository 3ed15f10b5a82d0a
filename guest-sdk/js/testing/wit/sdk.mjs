// `inlay:policy/sdk@0.1.0` for policies run natively under node (register.mjs).
import { interfaces } from '../host.mjs';

export const { defaultHook, builtinRecvLookup } = interfaces.sdk;
