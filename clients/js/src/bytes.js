/** Byte helpers: hex, fixed-width integers, concatenation. */

import { InvalidArgument } from './errors.js';

const HEX = /^(?:[0-9a-f]{2})*$/;
const U64 = (1n << 64n) - 1n;

/**
 * Decode lowercase or uppercase hex into bytes.
 * @param {string} hex
 * @param {string} what  name of the field, for the error message
 * @returns {Uint8Array}
 */
export function fromHex(hex, what = 'hex value') {
  if (typeof hex !== 'string' || !HEX.test(hex.toLowerCase())) {
    throw new InvalidArgument(
      `${what}: expected an even-length hex string, got ${JSON.stringify(hex)}`,
    );
  }
  return Uint8Array.from(Buffer.from(hex, 'hex'));
}

/** @param {Uint8Array} bytes @returns {string} lowercase hex */
export function toHex(bytes) {
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString('hex');
}

/** @param {Uint8Array[]} parts @returns {Uint8Array} */
export function concat(parts) {
  let size = 0;
  for (const p of parts) size += p.length;
  const out = new Uint8Array(size);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/** Token ids as consecutive little-endian u32. @param {number[]} tokens */
export function u32leTokens(tokens) {
  const out = new Uint8Array(tokens.length * 4);
  const view = new DataView(out.buffer);
  for (let i = 0; i < tokens.length; i++) view.setUint32(i * 4, tokens[i], true);
  return out;
}

/** @param {bigint} value @returns {Uint8Array} 8 bytes little-endian */
export function u64le(value) {
  const out = new Uint8Array(8);
  new DataView(out.buffer).setBigUint64(0, BigInt.asUintN(64, value), true);
  return out;
}

/** @param {bigint} value @returns {Uint8Array} 8 bytes big-endian */
export function u64be(value) {
  const out = new Uint8Array(8);
  new DataView(out.buffer).setBigUint64(0, BigInt.asUintN(64, value), false);
  return out;
}

/** Unsigned big-endian integer of the last 8 bytes. @param {Uint8Array} bytes */
export function lastU64be(bytes) {
  if (bytes.length < 8) throw new InvalidArgument(`need at least 8 bytes, got ${bytes.length}`);
  const view = new DataView(bytes.buffer, bytes.byteOffset + bytes.length - 8, 8);
  return view.getBigUint64(0, false);
}

/** Signed big-endian int64 of the first 8 bytes. @param {Uint8Array} bytes */
export function firstI64be(bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, 8);
  return view.getBigInt64(0, false);
}

/** Unsigned big-endian integer of exactly 8 bytes. @param {Uint8Array} bytes */
export function readU64be(bytes) {
  return new DataView(bytes.buffer, bytes.byteOffset, 8).getBigUint64(0, false);
}

export const MASK64 = U64;

/** UTF-8 bytes of a string. @param {string} s */
export function utf8(s) {
  return new TextEncoder().encode(s);
}
