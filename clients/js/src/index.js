/**
 * @tokenkeys/keys: an independent implementation of the client-computable tokenkeys cache-key
 * profiles, written from docs/cache-keys.md.
 */

export { blockKeys } from './keys.js';
export { buildSpec, parseSpec, specFingerprint, canonicalDigest } from './spec.js';
export { listProfiles, getProfile } from './profiles.js';
export { verifyVectors, loadVectorFile } from './vectors.js';
export { checkCacheSalt } from './context.js';
export { encode as cborEncode } from './cbor.js';
export { parse as parseJson, canonical as canonicalJson } from './json.js';
export { KeyError, InvalidArgument, Unsupported, NotFound, FailedPrecondition } from './errors.js';
