// `inlay:policy/cache@0.1.0` for policies run natively under node (register.mjs).
import { interfaces } from '../host.mjs';

export const { lookup, insert, purgeUrl, purgeKey } = interfaces.cache;
