// herald-plugin.js: Herald's plugin contract for plugins written in JavaScript (built with
// jco / componentize-js).
//
// The JavaScript counterpart of the Rust `herald-sdk`: plain functions over the `host`
// imports of the `herald:plugin` contract (proto/wit/herald-plugin.wit) and constructors for
// the hooks' answers. componentize-js binds `herald:plugin/host` to the world named on its
// command line; this module only wraps it.
//
//     import * as herald from '../herald-plugin.js';
//
//     export const messagePolicy = {
//       check(message) {
//         return herald.bodyText(message).includes('spam')
//           ? herald.reject('blocked-word', 'no spam')
//           : herald.allow();
//       },
//     };
//
// A hook is a method of an object exported under the interface's name in camel case
// (`messagePolicy.check`, `announcePolicy.check`, `routeKey.routeKey`, `degrade.chooseTier`,
// `connect.authorize`). Herald keeps a pool of instances and any of them may serve a call:
// module state is per instance (fine for a cache such as config()'s, wrong for state that
// must be shared; that goes in `kv`). Module-level code runs once at build time (Wizer
// snapshots the initialised engine) where the host is not there: call nothing from this
// module at the top level, only inside hooks.
//
// WIT `u64`/`s64` values are BigInts at the boundary; this module takes and returns plain
// numbers (milliseconds and counters stay far below 2^53).

import {
  config as hostConfig,
  counterAdd as hostCounterAdd,
  kvDelete,
  kvGet,
  kvIncrement,
  kvSet,
  kvSetIfAbsent,
  log as hostLog,
  nowMs as hostNowMs,
  rateLimit as hostRateLimit,
} from 'herald:plugin/host';
import { parse as parseToml } from 'smol-toml';

const utf8 = new TextEncoder();

function bytes(value) {
  return typeof value === 'string' ? utf8.encode(value) : Uint8Array.from(value);
}

function ttl(ttlMs) {
  return ttlMs === undefined || ttlMs === null ? undefined : BigInt(ttlMs);
}

// -- Answers of the message-policy hook -----------------------------------------------------

/** Let the message through unchanged. */
export function allow() {
  return { tag: 'allow' };
}

/**
 * Refuse the message: `code` is machine-readable (`blocked-word`), `reason` is sent to the
 * client; with `retryAfterMs` the client may retry after that many milliseconds.
 */
export function reject(code, reason, retryAfterMs) {
  return { tag: 'reject', val: { code, reason, retryAfterMs: ttl(retryAfterMs) } };
}

/** Replace the message body (a Uint8Array or a string, stored as UTF-8). */
export function rewrite(body) {
  return { tag: 'rewrite', val: bytes(body) };
}

/** A message body as text: UTF-8, invalid bytes replaced by U+FFFD. */
export function bodyText(message) {
  return new TextDecoder('utf-8').decode(message.body);
}

// -- Capabilities ---------------------------------------------------------------------------

/**
 * Key-value storage scoped to this plugin, shared by all its instances (and by every node
 * in cluster mode). `ttlMs` undefined keeps a key until it is deleted.
 */
export const kv = {
  /** The value (Uint8Array), or undefined when the key is absent or expired. */
  get(key) {
    return kvGet(key);
  },
  /** The value decoded as UTF-8, or undefined. */
  getString(key) {
    const value = kvGet(key);
    return value === undefined ? undefined : new TextDecoder('utf-8').decode(value);
  },
  /** Writes a key (a string is stored as its UTF-8 bytes). */
  set(key, value, ttlMs) {
    kvSet(key, bytes(value), ttl(ttlMs));
  },
  /** Writes a key only if it is absent: true when this call wrote it. */
  setIfAbsent(key, value, ttlMs) {
    return kvSetIfAbsent(key, bytes(value), ttl(ttlMs));
  },
  /** Adds `delta` to an integer key (absent = 0) and returns the new value. */
  increment(key, delta = 1, ttlMs) {
    return Number(kvIncrement(key, BigInt(delta), ttl(ttlMs)));
  },
  /** Removes a key: true when it existed. */
  delete(key) {
    return kvDelete(key);
  },
};

/**
 * Takes one token from the bucket `key`, refilled at `perSecond` up to `burst`: null when
 * the token was taken (go ahead), otherwise the milliseconds to wait.
 */
export function rateLimit(key, perSecond, burst) {
  const decision = hostRateLimit(key, perSecond, burst);
  return decision.tag === 'allowed' ? null : Number(decision.val);
}

/** The host's wall clock, milliseconds since the Unix epoch. */
export function nowMs() {
  return Number(hostNowMs());
}

function write(level, message, fields) {
  hostLog(level, message, Object.entries(fields ?? {}).map(([k, v]) => [String(k), String(v)]));
}

/**
 * Structured log lines, tagged with the plugin's name by the host:
 * `log.info('blocked a message', { sender: 'alice', word: 'spam' })`.
 */
export const log = {
  trace: (message, fields) => write('trace', message, fields),
  debug: (message, fields) => write('debug', message, fields),
  info: (message, fields) => write('info', message, fields),
  warn: (message, fields) => write('warn', message, fields),
  error: (message, fields) => write('error', message, fields),
};

/** Adds to a counter the host exports as `herald_plugin_<name>`. */
export function counterAdd(name, delta = 1) {
  hostCounterAdd(name, BigInt(delta));
}

/** The configuration as TOML text; empty when there is none. */
export function configText() {
  return hostConfig();
}

let cachedConfig;

/**
 * The plugin's configuration parsed into an object (empty when there is none). Parsed once
 * per instance: the host fixes it for the life of an instance. Malformed TOML throws, which
 * traps the call (the hook's failure policy answers and Herald logs the error).
 */
export function config() {
  if (cachedConfig === undefined) {
    cachedConfig = parseToml(hostConfig());
  }
  return cachedConfig;
}
