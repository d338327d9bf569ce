/** Locations of the repository's vector files and the shared engine captures. */

import { fileURLToPath } from 'node:url';

/** `<repo>/testvectors` (clients/js/../../testvectors). */
export const VECTORS_DIR = fileURLToPath(new URL('../../../testvectors/', import.meta.url));

/** `<repo>/../shared/vectors/vllm-kv-events`, present on project machines, absent elsewhere. */
export const KV_EVENTS_DIR = fileURLToPath(
  new URL('../../../../shared/vectors/vllm-kv-events/', import.meta.url),
);
