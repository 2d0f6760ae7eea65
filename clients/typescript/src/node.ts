/**
 * The Node entry: the same API, with `ws` as the WebSocket (Node 20 has no global one).
 * An explicit `WebSocket` option still wins.
 */
import WebSocket from "ws";
import { HeraldClient as BaseClient } from "./client.js";
import type { ClientOptions, WebSocketConstructor } from "./types.js";

export { uuid } from "./uuid.js";
export { Backoff, type BackoffOptions } from "./backoff.js";
export { protoCodec, type FrameCodec } from "./codec.js";
export { jsonCodec } from "./json.js";
export * from "./errors.js";
export * from "./store.js";
export type * from "./types.js";
export { bodyText } from "./index.js";

// `ws` implements the browser API the client uses; its event types are wider, hence the cast.
const NodeWebSocket = WebSocket as unknown as WebSocketConstructor;

export class HeraldClient extends BaseClient {
  constructor(options: ClientOptions) {
    super({ WebSocket: NodeWebSocket, ...options });
  }
}

/** Creates a client and starts connecting. */
export function connect(options: ClientOptions): HeraldClient {
  return new HeraldClient(options).start();
}
