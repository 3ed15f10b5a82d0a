// `inlay:policy/kv@0.1.0` for policies run natively under node (register.mjs).
import { interfaces } from '../host.mjs';

export const { get, set } = interfaces.kv;
const remove = interfaces.kv.delete;
export { remove as delete };
