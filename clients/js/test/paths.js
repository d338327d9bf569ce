/** Locations of the repository's vector files and of the real engine captures. */

import { fileURLToPath } from 'node:url';

/** `<repo>/testvectors` (clients/js/../../testvectors). */
export const VECTORS_DIR = fileURLToPath(new URL('../../../testvectors/', import.meta.url));

/** `<repo>/tests/data/vectors/vllm-kv-events`: events captured from a real vLLM engine. */
export const KV_EVENTS_DIR = fileURLToPath(
  new URL('../../../tests/data/vectors/vllm-kv-events/', import.meta.url),
);
