/** Small helpers over the WebSocket API the client uses. */
import type { WebSocketLike } from "./types.js";

/** `readyState` of an open socket. */
export const OPEN = 1;

/** Stops listening to a socket being let go. Its error handler stays a no-op: `ws` throws an
 * error event nobody listens to, and closing a socket still connecting emits one. */
export function detach(socket: WebSocketLike): void {
  socket.onopen = socket.onmessage = socket.onclose = null;
  socket.onerror = () => undefined;
}
