/** The public types of the Herald client. */
import type { BackoffOptions } from "./backoff.js";
import type { FrameCodec } from "./codec.js";
import type { HeraldError } from "./errors.js";
import type { SeqStore } from "./store.js";

/** A stored message. 64-bit ids and seqs are bigints: snowflake ids exceed 2^53. */
export interface HeraldMessage {
  readonly id: bigint;
  /** `dm:<a>:<b>`, `grp:<id>` or `room:<name>`. */
  readonly conversation: string;
  /** Position in the conversation, increasing (gaps allowed); 0 for an unarchived announcement. */
  readonly seq: bigint;
  readonly sender: string;
  readonly senderDevice: string;
  /** Application-defined. */
  readonly kind: number;
  readonly body: Uint8Array;
  /** When the server stored it, ms since the Unix epoch. */
  readonly sentAtMs: number;
}

/** Called for each incoming message, once, in seq order per conversation. */
export type MessageHandler = (message: HeraldMessage) => void | Promise<void>;

/** Why the token provider is called: the first connection, or the last token was refused (4001). */
export type TokenReason = "initial" | "expired";

/** Returns a token (a JWT, or `dev:<user>` against a dev-mode server). */
export type TokenProvider = (reason: TokenReason) => string | Promise<string>;

/** The part of the WebSocket API the client uses (browsers' WebSocket and `ws` both fit). */
export interface WebSocketLike {
  readonly readyState: number;
  readonly protocol: string;
  binaryType: string;
  onopen: ((event: unknown) => void) | null;
  onmessage: ((event: { data: unknown }) => void) | null;
  onclose: ((event: { code: number; reason: string }) => void) | null;
  onerror: ((event: unknown) => void) | null;
  send(data: string | Uint8Array): void;
  close(code?: number, reason?: string): void;
  /** `ws` only: drop the socket without a closing handshake. */
  terminate?(): void;
}

export type WebSocketConstructor = new (url: string, protocols?: string | string[]) => WebSocketLike;

export interface ClientOptions {
  /** The WebSocket URL, e.g. `ws://127.0.0.1:7070/v1/ws`. */
  readonly url: string;
  /** A token, or a function returning one; a function is called again after a 4001 close. */
  readonly token: string | TokenProvider;
  /** This device's id: 1–128 bytes of `[A-Za-z0-9._@-]`. */
  readonly deviceId: string;
  /** The subprotocol: `protoCodec` (default) or `jsonCodec`. */
  readonly codec?: FrameCodec;
  /** The WebSocket class; default: the global one (browsers), `ws` through the Node entry. */
  readonly WebSocket?: WebSocketConstructor;
  /** Where the last handled seq per conversation is kept (default: in memory). */
  readonly store?: SeqStore;
  /** Called for each incoming message; same as `on("message", …)`, set before connecting. */
  readonly onMessage?: MessageHandler;
  /** `auto` (default): acked once the handlers return. `manual`: the app calls `ack()`. */
  readonly ack?: "auto" | "manual";
  /** Reconnect backoff (full jitter). */
  readonly reconnect?: BackoffOptions;
  /**
   * Longest silence of the server before it is taken as gone, in ms (default 15000). The
   * client waits `heartbeat_ms` + 5 s when the server's heartbeat is quicker than that,
   * and pings by itself when it is slower.
   */
  readonly deadAfterMs?: number;
  /** From opening the socket to `connected`, in ms, before the attempt counts as failed (default 10000). */
  readonly connectTimeoutMs?: number;
  /** Most sends awaiting their `send_ack` at once (default 1000); the window halves on RETRY. */
  readonly maxInFlightSends?: number;
  /**
   * Frames per second the client writes at most (default 1800, under the server's default
   * of 2000 per connection, past which it closes with 4029); 0: no limit.
   */
  readonly maxFramesPerSecond?: number;
  /** How long a gap may last without progress before it is pulled with `sync`, in ms (default 250). */
  readonly gapTimeoutMs?: number;
  /** Acks are coalesced for this long, in ms (default 25). */
  readonly ackDelayMs?: number;
  /** After each connect, ask the server where each conversation stands (`sync`, limit 1; default true). */
  readonly catchUpOnConnect?: boolean;
  /** Largest send body, in bytes, refused locally above it (default 1 MiB less framing). */
  readonly maxBodyBytes?: number;
  /**
   * `client` of `connect`: names the client software to the server (informational only;
   * the server does not act on it).
   */
  readonly clientInfo?: { readonly name: string; readonly version: string };
  /** Consecutive 4001 closes before the client gives up (default 3). */
  readonly maxAuthFailures?: number;
  /** Source of randomness for the jitter (tests). */
  readonly random?: () => number;
}

export interface SendOptions {
  /** Application-defined kind (default 0). */
  readonly kind?: number;
  /** Reuse an id to settle an earlier send whose outcome is unknown (a UUID). */
  readonly clientMsgId?: string;
  /** Give up waiting after this long (the message may still be stored; see SendAbandonedError). */
  readonly timeoutMs?: number;
}

export interface SendResult {
  readonly messageId: bigint;
  readonly seq: bigint;
  /** The conversation it is stored in. */
  readonly conversation: string;
  readonly clientMsgId: string;
  /** The server had it already (a resend of a stored message): the ids are the original's. */
  readonly duplicate: boolean;
}

export type ClientState = "idle" | "connecting" | "connected" | "reconnecting" | "closed";

export interface ConnectedInfo {
  readonly userId: string;
  readonly deviceId: string;
  readonly nodeId: number;
  readonly sessionId: string;
  readonly heartbeatMs: number;
  readonly url: string;
  /** A reconnect (not the first connection of this client). */
  readonly reconnect: boolean;
}

/** A socket closed: a session that ended, or an attempt that never reached `connected`. */
export interface DisconnectedInfo {
  /** The close code (4000: the client found the server silent or the attempt timed out). */
  readonly code: number;
  readonly reason: string;
  /** The socket had reached `connected`. */
  readonly wasConnected: boolean;
  readonly willReconnect: boolean;
  /** When it will, after this long. */
  readonly reconnectInMs?: number;
}

export interface ResumedInfo {
  /** From the drop to the resumption. */
  readonly offlineMs: number;
  /** Sends resent with their original client_msg_id. */
  readonly resentSends: number;
  /** Rooms re-joined from their last seq. */
  readonly rooms: number;
}

export interface GoAwayInfo {
  readonly reason: string;
  readonly reconnectAfterMs: number;
  readonly reconnectUrl?: string;
}

export interface RetryInfo {
  readonly clientMsgId: string;
  readonly conversation: string;
  readonly reason: string;
  readonly retryAfterMs: number;
}

/** The events of a client, with their payloads. */
export interface ClientEvents {
  state: ClientState;
  connected: ConnectedInfo;
  disconnected: DisconnectedInfo;
  resumed: ResumedInfo;
  message: HeraldMessage;
  goAway: GoAwayInfo;
  retry: RetryInfo;
  error: HeraldError;
}

export interface HistoryPage {
  readonly conversation: string;
  /** Ascending seq. */
  readonly messages: HeraldMessage[];
  readonly hasMore: boolean;
}

export interface SyncedConversation {
  readonly conversation: string;
  readonly messages: HeraldMessage[];
  readonly completeThroughSeq: bigint;
  readonly latestSeq: bigint;
}
