/**
 * herald-client: the Herald instant-messaging client for browsers and Node >= 20.
 * This entry uses the global WebSocket (browsers); Node resolves to ./node.js, which uses `ws`.
 */
export { HeraldClient, connect } from "./client.js";
export { uuid } from "./uuid.js";
export { Backoff, type BackoffOptions } from "./backoff.js";
export { protoCodec, type FrameCodec } from "./codec.js";
export { jsonCodec } from "./json.js";
export * from "./errors.js";
export * from "./store.js";
export type * from "./types.js";

/** The body of a message as UTF-8 text. */
export function bodyText(message: { readonly body: Uint8Array }): string {
  return new TextDecoder().decode(message.body);
}
