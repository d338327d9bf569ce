/**
 * Minimal deterministic CBOR encoder (RFC 8949 §4.2.1 core deterministic encoding) for the
 * value types the cache-key profiles serialize (docs/cache-keys.md §1.3): integers (number
 * or bigint, −2^64..2^64−1), byte strings (Uint8Array), text strings, arrays, one-or-more-key
 * maps (Map or plain object) and null. Anything else is refused rather than guessed.
 */

import { InvalidArgument } from './errors.js';
import { utf8 } from './bytes.js';

const TWO64 = 1n << 64n;

class Writer {
  constructor(size = 256) {
    this.buf = new Uint8Array(size);
    this.len = 0;
  }

  ensure(extra) {
    if (this.len + extra <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.len + extra) size *= 2;
    const next = new Uint8Array(size);
    next.set(this.buf.subarray(0, this.len));
    this.buf = next;
  }

  byte(b) {
    this.ensure(1);
    this.buf[this.len++] = b;
  }

  bytes(src) {
    this.ensure(src.length);
    this.buf.set(src, this.len);
    this.len += src.length;
  }

  /** Head with the shortest argument form. `n` is a non-negative number or bigint. */
  head(major, n) {
    const m = major << 5;
    if (typeof n === 'number' && n <= 0xffffffff) {
      this.ensure(5);
      const b = this.buf;
      if (n < 24) {
        b[this.len++] = m | n;
      } else if (n < 0x100) {
        b[this.len++] = m | 24;
        b[this.len++] = n;
      } else if (n < 0x10000) {
        b[this.len++] = m | 25;
        b[this.len++] = n >>> 8;
        b[this.len++] = n & 0xff;
      } else {
        b[this.len++] = m | 26;
        b[this.len++] = n >>> 24;
        b[this.len++] = (n >>> 16) & 0xff;
        b[this.len++] = (n >>> 8) & 0xff;
        b[this.len++] = n & 0xff;
      }
      return;
    }
    const big = BigInt(n);
    if (big <= 0xffffffffn) {
      this.head(major, Number(big));
      return;
    }
    this.ensure(9);
    this.buf[this.len++] = m | 27;
    for (let shift = 56n; shift >= 0n; shift -= 8n) {
      this.buf[this.len++] = Number((big >> shift) & 0xffn);
    }
  }

  result() {
    return this.buf.slice(0, this.len);
  }
}

function encodeInt(w, value) {
  if (typeof value === 'number') {
    if (!Number.isSafeInteger(value)) {
      throw new InvalidArgument(`CBOR: ${value} is not a safe integer; pass a bigint`);
    }
    if (value >= 0) w.head(0, value);
    else w.head(1, -1 - value);
    return;
  }
  if (value >= 0n) {
    if (value >= TWO64) throw new InvalidArgument(`CBOR: integer ${value} does not fit 64 bits`);
    w.head(0, value);
  } else {
    if (value < -TWO64) throw new InvalidArgument(`CBOR: integer ${value} does not fit 64 bits`);
    w.head(1, -1n - value);
  }
}

function compareBytes(a, b) {
  if (a.length !== b.length) return a.length - b.length;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return a[i] - b[i];
  return 0;
}

function encodeInto(w, value) {
  if (value === null) {
    w.byte(0xf6);
  } else if (typeof value === 'number' || typeof value === 'bigint') {
    encodeInt(w, value);
  } else if (typeof value === 'string') {
    const b = utf8(value);
    w.head(3, b.length);
    w.bytes(b);
  } else if (value instanceof Uint8Array) {
    w.head(2, value.length);
    w.bytes(value);
  } else if (Array.isArray(value)) {
    w.head(4, value.length);
    for (const item of value) encodeInto(w, item);
  } else if (
    value instanceof Map ||
    (typeof value === 'object' && Object.getPrototypeOf(value) === Object.prototype)
  ) {
    const entries = value instanceof Map ? [...value.entries()] : Object.entries(value);
    // Deterministic order: keys sorted by their encoded bytes (length first, then bytewise),
    // the rule cbor2 canonical=True and fxamacker CanonicalEncOptions share.
    const encoded = entries.map(([k, v]) => [encode(k), v]);
    encoded.sort((a, b) => compareBytes(a[0], b[0]));
    w.head(5, encoded.length);
    for (const [k, v] of encoded) {
      w.bytes(k);
      encodeInto(w, v);
    }
  } else {
    throw new InvalidArgument(`CBOR: cannot encode ${String(value)} (${typeof value})`);
  }
}

/**
 * Encode a value in deterministic CBOR.
 * @param {unknown} value
 * @returns {Uint8Array}
 */
export function encode(value) {
  const w = new Writer();
  encodeInto(w, value);
  return w.result();
}
