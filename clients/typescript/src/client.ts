/**
 * The Herald client: one WebSocket session at a time, kept up across drops, following
 * docs/PROTOCOL.md and clients/SPEC.md (which states the behaviour this code implements).
 */
import { Backoff } from "./backoff.js";
import { fromWire, protoCodec, type Frame, type FrameBody, type FrameCodec } from "./codec.js";
import {
  ConnectionClosedError,
  HandlerError,
  HeraldError,
  ProtocolError,
  SendAbandonedError,
  SendRejectedError,
  ServerError,
  TokenError,
} from "./errors.js";
import { Emitter } from "./events.js";
import { SendAck_Status, type ConversationSync, type Message as WireMessage } from "./gen/herald/v1/frames_pb.js";
import { ConversationOrder, type Release } from "./order.js";
import { FrameBudget, SendWindow } from "./pacing.js";
import { MemorySeqStore, type SeqStore } from "./store.js";
import type {
  ClientEvents,
  ClientOptions,
  ClientState,
  ConnectedInfo,
  HeraldMessage,
  HistoryPage,
  SendOptions,
  SendResult,
  SyncedConversation,
  WebSocketConstructor,
  WebSocketLike,
} from "./types.js";

type Timer = ReturnType<typeof setTimeout>;

const OPEN = 1;
/** Client-side close code for a socket the client dropped itself (silent server, timeout). */
const CLIENT_DROP = 4000;
/** Close codes after which reconnecting would not help (or would fight another device). */
const FATAL_CLOSES = new Set([4003, 4009]);
/** A connection that held this long counts as good: the backoff starts over after it. */
const STABLE_AFTER_MS = 5_000;
/** The server answers within `heartbeat_ms`; the margin for the network (PROTOCOL.md). */
const HEARTBEAT_MARGIN_MS = 3_000;
/** Longest wait between pulls of a gap the server cannot close yet (seqs still in flight). */
const MAX_PULL_DELAY_MS = 5_000;

interface PendingSend {
  readonly clientMsgId: string;
  readonly conversation: string;
  readonly kind: number;
  readonly body: Uint8Array;
  readonly resolve: (result: SendResult) => void;
  readonly reject: (error: Error) => void;
  /** Written on the current connection and awaiting its `send_ack`. */
  onWire: boolean;
  /** When it was last written (the send window's RETRY rule). */
  sentAt: number;
  /** After a RETRY: not written again before this time. */
  notBefore: number;
  deadline?: Timer | undefined;
}

interface PendingRequest {
  readonly body: FrameBody;
  readonly expect: "syncReply" | "historyReply";
  readonly resolve: (frame: Frame) => void;
  readonly reject: (error: Error) => void;
  /** The app's requests are resent after a reconnect; internal pulls are re-armed instead. */
  readonly resend: boolean;
}

interface Conversation {
  readonly name: string;
  readonly room: boolean;
  readonly order: ConversationOrder<HeraldMessage>;
  /** Handlers run one after another per conversation: seq order, ack after the handler. */
  chain: Promise<void>;
  /** The last position handled and stored. */
  handled: bigint | undefined;
  pulling: boolean;
  gapTimer?: Timer | undefined;
  pullDelayMs: number;
}

interface Room {
  waiters: { resolve: (value: { room: string; latestSeq: bigint }) => void; reject: (error: Error) => void }[];
}

interface Resuming {
  readonly offlineMs: number;
  readonly resentSends: number;
  readonly rooms: Set<string>;
  probe: boolean;
  readonly roomCount: number;
}

export class HeraldClient extends Emitter<ClientEvents> {
  private readonly options: ClientOptions;
  private readonly codec: FrameCodec;
  private readonly store: SeqStore;
  private readonly backoff: Backoff;
  private readonly WebSocketImpl: WebSocketConstructor | undefined;
  private readonly deadAfterMs: number;

  private currentState: ClientState = "idle";
  private socket: WebSocketLike | undefined;
  private info: ConnectedInfo | undefined;
  private everConnected = false;
  private url: string;
  private token: string | undefined;
  private tokenExpired = false;
  private authFailures = 0;
  private goAway: { reconnectAfterMs: number; reconnectUrl: string } | undefined;

  private reconnectTimer: Timer | undefined;
  private connectTimer: Timer | undefined;
  private tickTimer: ReturnType<typeof setInterval> | undefined;
  private goAwayTimer: Timer | undefined;
  private ackTimer: Timer | undefined;
  private lastHeardAt = 0;
  private lastPingAt = 0;
  private connectedAt = 0;
  private droppedAt = 0;
  private silenceLimitMs = 0;
  private pingWhenSilent = true;
  /** The server asks for the pongs it needs (`Ping.reply`); an older one wants every ping answered. */
  private serverAsks = false;
  private nextRidValue = 1;

  private readonly sends = new Map<string, PendingSend>();
  private sendsOnWire = 0;
  private readonly window: SendWindow;
  private readonly budget: FrameBudget;
  private pumpTimer: Timer | undefined;
  private readonly requests = new Map<number, PendingRequest>();
  private queuedRequests: PendingRequest[] = [];
  private readonly rooms = new Map<string, Room>();
  private readonly roomRids = new Map<number, string>();
  private readonly conversations = new Map<string, Conversation>();
  private readonly ackDue = new Map<string, bigint>();
  private resuming: Resuming | undefined;

  constructor(options: ClientOptions) {
    super();
    this.options = options;
    this.codec = options.codec ?? protoCodec;
    this.store = options.store ?? new MemorySeqStore();
    this.backoff = new Backoff(options.reconnect, options.random);
    this.url = options.url;
    this.deadAfterMs = options.deadAfterMs ?? 15_000;
    this.window = new SendWindow(options.maxInFlightSends ?? 1_000);
    this.budget = new FrameBudget(options.maxFramesPerSecond ?? 1_800);
    this.WebSocketImpl =
      options.WebSocket ?? (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket ?? undefined;
    if (options.onMessage) this.on("message", options.onMessage);
  }

  /** Where the client is: idle → connecting → connected → reconnecting → … → closed. */
  get state(): ClientState {
    return this.currentState;
  }

  /** The current session, while connected. */
  get session(): ConnectedInfo | undefined {
    return this.currentState === "connected" ? this.info : undefined;
  }

  /** Opens the connection (in the background); returns the client. */
  start(): this {
    if (this.currentState === "idle") {
      if (!this.WebSocketImpl) throw new HeraldError("no WebSocket here: pass options.WebSocket (or use the Node entry)");
      void this.open();
    }
    return this;
  }

  /** Resolves once connected (now, if already). */
  whenConnected(): Promise<ConnectedInfo> {
    const info = this.session;
    if (info) return Promise.resolve(info);
    if (this.currentState === "closed") return Promise.reject(new ConnectionClosedError(1000, "client closed"));
    return new Promise((resolve, reject) => {
      const offConnected = this.on("connected", (value) => {
        offConnected();
        offState();
        resolve(value);
      });
      const offState = this.on("state", (value) => {
        if (value !== "closed") return;
        offConnected();
        offState();
        reject(new ConnectionClosedError(1000, "client closed"));
      });
    });
  }

  /**
   * Sends a message. Resolves once the server stored it (`OK`, or `DUPLICATE` for a resend
   * it had already stored). A `RETRY` or a lost connection resends it with the same
   * `client_msg_id`, so one call stores one message. Rejects with `SendRejectedError` on
   * `REJECTED`, `SendAbandonedError` when closed or timed out before an answer.
   */
  send(conversation: string, body: Uint8Array | string, options: SendOptions = {}): Promise<SendResult> {
    const clientMsgId = options.clientMsgId ?? uuid();
    if (this.currentState === "closed") {
      return Promise.reject(new SendAbandonedError("the client is closed", clientMsgId, conversation));
    }
    // A copy: a resend must carry the bytes of the call even if the caller reuses its buffer.
    const bytes = typeof body === "string" ? new TextEncoder().encode(body) : body.slice();
    const max = this.options.maxBodyBytes ?? 1_047_552;
    if (bytes.byteLength > max) {
      return Promise.reject(
        new SendRejectedError(`body of ${bytes.byteLength} bytes is over ${max} (not sent)`, clientMsgId, conversation),
      );
    }
    if (this.sends.has(clientMsgId)) {
      return Promise.reject(new HeraldError(`a send with client_msg_id ${clientMsgId} is already under way`));
    }
    return new Promise<SendResult>((resolve, reject) => {
      const pending: PendingSend = {
        clientMsgId,
        conversation,
        kind: options.kind ?? 0,
        body: bytes,
        resolve,
        reject,
        onWire: false,
        sentAt: 0,
        notBefore: 0,
      };
      if (options.timeoutMs !== undefined) {
        pending.deadline = setTimeout(() => {
          this.settleSend(pending);
          reject(new SendAbandonedError(`no answer within ${options.timeoutMs} ms`, clientMsgId, conversation));
          this.pump();
        }, options.timeoutMs);
      }
      this.sends.set(clientMsgId, pending);
      this.pump();
    });
  }

  /**
   * Joins a room (`room:<name>`, or just `<name>`) for as long as the client lives or until
   * `unsubscribe`. After every reconnect it is joined again from the last seq seen
   * (`since_seq`), so nothing stored in between is missed.
   */
  subscribe(room: string): Promise<{ room: string; latestSeq: bigint }> {
    const name = room.startsWith("room:") ? room : `room:${room}`;
    if (this.currentState === "closed") return Promise.reject(new ConnectionClosedError(1000, "client closed"));
    let entry = this.rooms.get(name);
    if (!entry) this.rooms.set(name, (entry = { waiters: [] }));
    const waiters = entry.waiters;
    return new Promise((resolve, reject) => {
      waiters.push({ resolve, reject });
      if (this.currentState === "connected") this.sendSubscribe(name);
    });
  }

  /** Leaves a room; its last seq is kept, so joining it again later catches up from there. */
  unsubscribe(room: string): void {
    const name = room.startsWith("room:") ? room : `room:${room}`;
    const entry = this.rooms.get(name);
    if (!entry) return;
    this.rooms.delete(name);
    for (const waiter of entry.waiters) waiter.reject(new HeraldError(`unsubscribed from ${name}`));
    this.transmit({ case: "unsubscribe", value: { room: name } });
  }

  /** A page of history before `beforeSeq` (default: the latest), ascending. */
  async history(conversation: string, options: { beforeSeq?: bigint; limit?: number } = {}): Promise<HistoryPage> {
    const frame = await this.request(
      { case: "history", value: { conversation, beforeSeq: options.beforeSeq ?? 0n, limit: options.limit ?? 0 } },
      "historyReply",
      true,
    );
    const reply = frame.body.case === "historyReply" ? frame.body.value : undefined;
    return {
      conversation: reply?.conversation ?? conversation,
      messages: (reply?.messages ?? []).map(fromWire),
      hasMore: reply?.hasMore ?? false,
    };
  }

  /**
   * Pulls what follows each cursor (none: every direct and group conversation, from the
   * server's cursors of this device). The messages are returned, not emitted.
   */
  async sync(cursors: { conversation: string; seq: bigint }[] = [], limit = 0): Promise<SyncedConversation[]> {
    const frame = await this.request({ case: "sync", value: { cursors, limit } }, "syncReply", true);
    const reply = frame.body.case === "syncReply" ? frame.body.value : undefined;
    return (reply?.conversations ?? []).map((entry) => ({
      conversation: entry.conversation,
      messages: entry.messages.map(fromWire),
      completeThroughSeq: entry.completeThroughSeq,
      latestSeq: entry.latestSeq,
    }));
  }

  /**
   * With `ack: "manual"`: marks `message` and everything before it in its conversation as
   * handled (cumulative), stores its seq and acknowledges it to the server.
   */
  ack(message: HeraldMessage): void {
    const conversation = this.conversations.get(message.conversation);
    const cursor = conversation?.order.cursor;
    if (!conversation || cursor === undefined || message.seq === 0n) return;
    this.markHandled(conversation, message.seq > cursor ? cursor : message.seq);
  }

  /**
   * Closes the client for good: waits for the handlers already running, sends their acks,
   * closes the socket. Sends without a final answer reject with `SendAbandonedError`.
   */
  async close(): Promise<void> {
    if (this.currentState === "closed") return;
    const socket = this.socket;
    if (socket) socket.onmessage = null;
    const wasConnected = this.currentState === "connected";
    this.shutDown(new ConnectionClosedError(1000, "closed by the client"));
    if (wasConnected) {
      this.notify("disconnected", { code: 1000, reason: "closed by the client", wasConnected, willReconnect: false });
    }
    await Promise.all([...this.conversations.values()].map((conversation) => conversation.chain));
    this.flushAcks(socket);
    if (socket) {
      detach(socket);
      try {
        socket.close(1000, "client closed");
      } catch {
        // Closing a socket that never opened throws in some implementations; it is gone anyway.
      }
    }
  }

  // --- connection ---------------------------------------------------------------------

  private async open(): Promise<void> {
    this.reconnectTimer = undefined;
    this.goAway = undefined;
    this.setState("connecting");
    let token: string;
    try {
      token = await this.currentToken();
    } catch (error) {
      if (this.currentState === "closed") return;
      this.notify("error", new TokenError(`token provider failed: ${String(error)}`, { cause: error }));
      this.scheduleReconnect(this.backoff.next());
      return;
    }
    if (this.currentState === "closed") return;
    const url = this.url;
    let socket: WebSocketLike;
    try {
      socket = new this.WebSocketImpl!(url, [this.codec.subprotocol]);
    } catch (error) {
      this.notify("error", new HeraldError(`cannot open ${url}: ${String(error)}`, { cause: error }));
      this.url = this.options.url;
      this.scheduleReconnect(this.backoff.next());
      return;
    }
    this.socket = socket;
    socket.binaryType = "arraybuffer";
    const timeout = this.options.connectTimeoutMs ?? 10_000;
    this.connectTimer = setTimeout(() => this.abandon(`no connected within ${timeout} ms`), timeout);
    socket.onopen = () => {
      const client = this.options.clientInfo ?? { name: "herald-client-ts", version: "0.1.0" };
      this.transmit({ case: "connect", value: { token, deviceId: this.options.deviceId, client } }, this.rid());
    };
    socket.onmessage = (event) => this.onData(socket, event.data);
    socket.onclose = (event) => this.onDrop(socket, event.code, event.reason);
    // An error is always followed by a close, which is where the client acts.
    socket.onerror = () => undefined;
  }

  private async currentToken(): Promise<string> {
    const source = this.options.token;
    if (typeof source === "string") return source;
    if (this.token === undefined || this.tokenExpired) {
      const reason = this.token === undefined ? "initial" : "expired";
      const token = await source(reason);
      if (typeof token !== "string" || token === "") throw new Error("the token provider returned no token");
      this.token = token;
      this.tokenExpired = false;
    }
    return this.token;
  }

  /** Drops the current socket without waiting for a closing handshake, and reconnects. */
  private abandon(reason: string): void {
    const socket = this.socket;
    if (!socket) return;
    detach(socket);
    try {
      if (socket.terminate) socket.terminate();
      else socket.close(CLIENT_DROP, reason.slice(0, 120));
    } catch {
      // Already closed: nothing to release.
    }
    this.onDrop(socket, CLIENT_DROP, reason);
  }

  private onDrop(socket: WebSocketLike, code: number, reason: string): void {
    if (socket !== this.socket) return;
    detach(socket);
    this.socket = undefined;
    const wasConnected = this.currentState === "connected";
    this.clearConnectionTimers();
    this.resetConnectionState(code, reason);
    if (this.currentState === "closed") return;
    if (wasConnected) this.droppedAt = Date.now();
    if (wasConnected && Date.now() - this.connectedAt >= STABLE_AFTER_MS) this.backoff.reset();

    let fatal = FATAL_CLOSES.has(code);
    let delay: number;
    if (code === 4001) {
      // The token was refused: ask the provider for a new one, at once the first time.
      this.authFailures += 1;
      this.tokenExpired = true;
      fatal ||= typeof this.options.token === "string" || this.authFailures >= (this.options.maxAuthFailures ?? 3);
      delay = this.authFailures === 1 ? 0 : this.backoff.next();
    } else if (this.goAway) {
      // The server drains: it spread the waits itself, and may name another node.
      delay = this.goAway.reconnectAfterMs;
      if (this.goAway.reconnectUrl) this.url = this.goAway.reconnectUrl;
      this.backoff.reset();
    } else {
      // A URL from go_away that does not answer: back to the configured one.
      if (!wasConnected) this.url = this.options.url;
      delay = this.backoff.next();
    }
    if (fatal) {
      this.notify("disconnected", { code, reason, wasConnected, willReconnect: false });
      this.shutDown(new ConnectionClosedError(code, reason));
      return;
    }
    this.notify("disconnected", { code, reason, wasConnected, willReconnect: true, reconnectInMs: delay });
    this.scheduleReconnect(delay);
  }

  private scheduleReconnect(delay: number): void {
    if (this.currentState === "closed") return;
    this.setState("reconnecting");
    this.reconnectTimer = setTimeout(() => void this.open(), delay);
  }

  /** What a lost connection takes with it; what it leaves (sends, rooms, cursors) is resent. */
  private resetConnectionState(code: number, reason: string): void {
    for (const pending of this.sends.values()) {
      pending.onWire = false;
      pending.notBefore = 0;
    }
    this.sendsOnWire = 0;
    clearTimeout(this.pumpTimer);
    this.pumpTimer = undefined;
    for (const request of this.requests.values()) {
      if (request.resend) this.queuedRequests.push(request);
      else request.reject(new ConnectionClosedError(code, reason));
    }
    this.requests.clear();
    this.roomRids.clear();
    for (const conversation of this.conversations.values()) {
      conversation.pulling = false;
      clearTimeout(conversation.gapTimer);
      conversation.gapTimer = undefined;
    }
    this.resuming = undefined;
  }

  private clearConnectionTimers(): void {
    clearTimeout(this.connectTimer);
    clearTimeout(this.goAwayTimer);
    clearInterval(this.tickTimer);
    this.connectTimer = this.tickTimer = this.goAwayTimer = undefined;
  }

  /** Ends the client: nothing more is sent or retried; everything waiting is rejected. */
  private shutDown(cause: ConnectionClosedError): void {
    this.setState("closed");
    clearTimeout(this.reconnectTimer);
    clearTimeout(this.pumpTimer);
    clearTimeout(this.ackTimer);
    this.ackTimer = undefined;
    this.clearConnectionTimers();
    this.resetConnectionState(cause.code, cause.reason);
    for (const pending of [...this.sends.values()]) {
      this.settleSend(pending);
      pending.reject(
        new SendAbandonedError(`send abandoned: ${cause.message}`, pending.clientMsgId, pending.conversation, { cause }),
      );
    }
    for (const request of this.queuedRequests) request.reject(cause);
    this.queuedRequests = [];
    for (const room of this.rooms.values()) for (const waiter of room.waiters) waiter.reject(cause);
    for (const room of this.rooms.values()) room.waiters = [];
    if (cause.code !== 1000 || cause.reason !== "closed by the client") this.notify("error", cause);
  }

  // --- incoming frames ------------------------------------------------------------------

  private onData(socket: WebSocketLike, data: unknown): void {
    if (socket !== this.socket) return;
    this.lastHeardAt = Date.now();
    let frame: Frame;
    try {
      frame = this.codec.decode(data);
    } catch (error) {
      this.notify("error", error instanceof HeraldError ? error : new ProtocolError(String(error)));
      return;
    }
    const body = frame.body;
    switch (body.case) {
      case "connected":
        return this.onConnected(body.value);
      case "sendAck":
        return this.onSendAck(body.value);
      case "deliver":
        if (body.value.message) this.onIncoming(body.value.message);
        return;
      case "syncReply":
      case "historyReply":
        return this.onReply(frame);
      case "subscribed":
        return this.onSubscribed(frame.rid, body.value.room, body.value.latestSeq, body.value.messages);
      case "syncHint":
        return this.onSyncHint(body.value.conversation, body.value.latestSeq);
      case "ping":
        // Answered when the server asks (`reply`): the other pings only show it is alive, and
        // answering them would cost both sides a frame each. A server from before the field
        // (no `client_timeout_ms` in `connected`) never asks, so every ping is answered.
        if (body.value.reply || !this.serverAsks) {
          this.transmit({ case: "pong", value: { timeMs: body.value.timeMs } }, frame.rid);
        }
        return;
      case "pong":
        return;
      case "goAway":
        return this.onGoAway(body.value.reason, body.value.reconnectAfterMs, body.value.reconnectUrl);
      case "error":
        return this.onServerError(frame.rid || body.value.rid, body.value.code, body.value.message);
      default:
        this.notify("error", new ProtocolError(`unexpected frame from the server: ${body.case ?? "no body"}`));
    }
  }

  private onConnected(connected: {
    userId: string;
    deviceId: string;
    nodeId: number;
    sessionId: string;
    heartbeatMs: number;
    clientTimeoutMs: number;
  }): void {
    clearTimeout(this.connectTimer);
    this.connectTimer = undefined;
    const reconnect = this.everConnected;
    if (this.info && this.info.userId !== connected.userId) this.conversations.clear();
    this.everConnected = true;
    this.authFailures = 0;
    this.connectedAt = this.lastHeardAt = Date.now();
    const { userId, deviceId, nodeId, sessionId, heartbeatMs } = connected;
    this.info = { userId, deviceId, nodeId, sessionId, heartbeatMs, url: this.url, reconnect };
    // Dead-server detection: silence past the server's heartbeat plus a margin, capped by
    // deadAfterMs; when the server's heartbeat is slower than that cap, ping it ourselves.
    this.serverAsks = connected.clientTimeoutMs > 0;
    const heartbeat = connected.heartbeatMs;
    this.silenceLimitMs = heartbeat > 0 ? Math.min(this.deadAfterMs, heartbeat + HEARTBEAT_MARGIN_MS) : this.deadAfterMs;
    this.pingWhenSilent = heartbeat <= 0 || heartbeat + HEARTBEAT_MARGIN_MS > this.deadAfterMs;
    const tick = Math.max(50, Math.min(1_000, Math.floor(this.silenceLimitMs / 5)));
    this.tickTimer = setInterval(() => this.tick(), tick);
    this.setState("connected");
    this.notify("connected", this.info);

    // Rooms first: a send to a room passes only once this connection is subscribed.
    const rooms = [...this.rooms.keys()];
    if (reconnect) {
      this.resuming = {
        offlineMs: Date.now() - this.droppedAt,
        resentSends: this.sends.size,
        rooms: new Set(rooms),
        probe: this.options.catchUpOnConnect !== false,
        roomCount: rooms.length,
      };
    }
    for (const room of rooms) this.sendSubscribe(room);
    if (this.options.catchUpOnConnect !== false) this.probe();
    const queued = this.queuedRequests;
    this.queuedRequests = [];
    for (const request of queued) this.transmitRequest(request);
    this.pump();
    this.flushAcks(this.socket);
    for (const conversation of this.conversations.values()) this.checkGap(conversation);
    this.maybeResumed();
  }

  private tick(): void {
    const silent = Date.now() - this.lastHeardAt;
    if (silent > this.silenceLimitMs) {
      this.abandon(`server silent for ${silent} ms`);
    } else if (this.pingWhenSilent && silent > this.silenceLimitMs / 2 && Date.now() - this.lastPingAt > this.silenceLimitMs / 2) {
      this.lastPingAt = Date.now();
      this.transmit({ case: "ping", value: { timeMs: BigInt(Date.now()) } });
    }
  }

  private onGoAway(reason: string, reconnectAfterMs: number, reconnectUrl: string): void {
    this.goAway = { reconnectAfterMs, reconnectUrl };
    this.notify("goAway", reconnectUrl ? { reason, reconnectAfterMs, reconnectUrl } : { reason, reconnectAfterMs });
    // Acks still owed go out before the server closes (it drops what is queued for us).
    this.flushAcks(this.socket);
    // The server closes with 1012 right after; if that close gets lost, drop it ourselves.
    this.goAwayTimer = setTimeout(() => this.abandon(reason), 2_000);
  }

  private onServerError(rid: number, code: string, message: string): void {
    const error = new ServerError(code, message, rid);
    const request = this.requests.get(rid);
    if (request) {
      this.requests.delete(rid);
      request.reject(error);
      return;
    }
    const room = this.roomRids.get(rid);
    if (room !== undefined) {
      this.roomRids.delete(rid);
      const entry = this.rooms.get(room);
      this.rooms.delete(room);
      for (const waiter of entry?.waiters ?? []) waiter.reject(error);
      this.resuming?.rooms.delete(room);
      this.maybeResumed();
    }
    this.notify("error", error);
  }

  private onReply(frame: Frame): void {
    const request = this.requests.get(frame.rid);
    if (!request) return;
    this.requests.delete(frame.rid);
    if (frame.body.case === request.expect) request.resolve(frame);
    else request.reject(new ProtocolError(`expected ${request.expect}, got ${frame.body.case ?? "no body"}`));
  }

  // --- sends ----------------------------------------------------------------------------

  /**
   * Writes waiting sends in call order, within the send window and the frame budget. A send
   * waiting out a RETRY holds back those behind it: the server is busy for them too.
   */
  private pump(): void {
    clearTimeout(this.pumpTimer);
    this.pumpTimer = undefined;
    if (this.currentState !== "connected") return;
    for (const pending of this.sends.values()) {
      if (pending.onWire) continue;
      if (this.sendsOnWire >= this.window.size) return; // the next send_ack pumps again
      const wait = Math.max(pending.notBefore - Date.now(), this.budget.wait());
      if (wait > 0) {
        this.pumpTimer = setTimeout(() => this.pump(), wait);
        return;
      }
      pending.onWire = true;
      pending.sentAt = Date.now();
      this.sendsOnWire += 1;
      const { clientMsgId, conversation, kind, body } = pending;
      this.transmit({ case: "send", value: { clientMsgId, conversation, kind, body } }, this.rid());
    }
  }

  private settleSend(pending: PendingSend): void {
    if (this.sends.get(pending.clientMsgId) !== pending) return;
    this.sends.delete(pending.clientMsgId);
    if (pending.onWire) this.sendsOnWire -= 1;
    pending.onWire = false;
    clearTimeout(pending.deadline);
  }

  private onSendAck(ack: {
    clientMsgId: string;
    status: SendAck_Status;
    messageId: bigint;
    seq: bigint;
    conversation: string;
    reason: string;
    retryAfterMs: number;
  }): void {
    const pending = this.sends.get(ack.clientMsgId);
    if (!pending || !pending.onWire) return;
    const conversation = ack.conversation || pending.conversation;
    switch (ack.status) {
      case SendAck_Status.OK:
      case SendAck_Status.DUPLICATE: {
        this.settleSend(pending);
        this.window.stored();
        pending.resolve({
          messageId: ack.messageId,
          seq: ack.seq,
          conversation,
          clientMsgId: ack.clientMsgId,
          duplicate: ack.status === SendAck_Status.DUPLICATE,
        });
        // Our own message takes its seq in the conversation; the server does not push it to us.
        const state = this.conversation(conversation);
        this.release(state, state.order.markOwn(ack.seq));
        this.checkGap(state);
        break;
      }
      case SendAck_Status.RETRY: {
        // Written again, same client_msg_id, once the wait is over; meanwhile fewer in flight.
        pending.onWire = false;
        this.sendsOnWire -= 1;
        pending.notBefore = Date.now() + ack.retryAfterMs;
        this.window.retried(pending.sentAt, Date.now());
        this.notify("retry", { clientMsgId: ack.clientMsgId, conversation, reason: ack.reason, retryAfterMs: ack.retryAfterMs });
        break;
      }
      default: {
        this.settleSend(pending);
        const retryAfter = ack.retryAfterMs > 0 ? ack.retryAfterMs : undefined;
        const reason = ack.status === SendAck_Status.REJECTED ? ack.reason : `unknown status ${ack.status}: ${ack.reason}`;
        pending.reject(new SendRejectedError(reason, ack.clientMsgId, conversation, retryAfter));
      }
    }
    this.pump();
  }

  // --- requests -------------------------------------------------------------------------

  private request(body: FrameBody, expect: PendingRequest["expect"], resend: boolean): Promise<Frame> {
    if (this.currentState === "closed") return Promise.reject(new ConnectionClosedError(1000, "client closed"));
    return new Promise((resolve, reject) => {
      const request: PendingRequest = { body, expect, resolve, reject, resend };
      if (this.currentState === "connected") this.transmitRequest(request);
      else this.queuedRequests.push(request);
    });
  }

  private transmitRequest(request: PendingRequest): void {
    const rid = this.rid();
    this.requests.set(rid, request);
    this.transmit(request.body, rid);
  }

  private sendSubscribe(room: string): void {
    const since = this.conversation(room).order.cursor;
    const rid = this.rid();
    this.roomRids.set(rid, room);
    this.transmit({ case: "subscribe", value: since === undefined ? { room } : { room, sinceSeq: since } }, rid);
  }

  // --- incoming messages: order, gaps, handlers, acks -------------------------------------

  private conversation(name: string): Conversation {
    let conversation = this.conversations.get(name);
    if (!conversation) {
      const room = name.startsWith("room:");
      const stored = this.store.get(this.storeKey(name));
      conversation = {
        name,
        room,
        // Direct and group conversations start where the server's pushes start (its cursor
        // of this device); rooms start at `subscribed`.
        order: new ConversationOrder<HeraldMessage>(stored, !room),
        chain: Promise.resolve(),
        handled: stored,
        pulling: false,
        pullDelayMs: this.gapTimeoutMs(),
      };
      this.conversations.set(name, conversation);
    }
    return conversation;
  }

  private storeKey(conversation: string): string {
    return `${this.info?.userId ?? ""}/${this.options.deviceId}/${conversation}`;
  }

  private isOwn(message: WireMessage | HeraldMessage): boolean {
    return message.sender === this.info?.userId && message.senderDevice === this.info.deviceId;
  }

  private onIncoming(wire: WireMessage): void {
    const message = fromWire(wire);
    const conversation = this.conversation(message.conversation);
    if (message.seq === 0n) {
      // An announcement that was not archived has no place in the order: emit it as it comes.
      this.release(conversation, [{ seq: 0n, message }]);
      return;
    }
    const released = conversation.order.offer(message, this.isOwn(message));
    if (released === undefined) {
      // A redelivery: our ack was lost with a connection. Acknowledge again.
      if (conversation.handled !== undefined && !conversation.room) this.queueAck(conversation.name, conversation.handled);
      return;
    }
    this.release(conversation, released);
    this.checkGap(conversation);
  }

  private onSubscribed(rid: number, room: string, latestSeq: bigint, messages: WireMessage[]): void {
    this.roomRids.delete(rid);
    const conversation = this.conversation(room);
    const released: Release<HeraldMessage>[] = [];
    if (conversation.order.cursor === undefined) released.push(...conversation.order.setBaseline(latestSeq));
    for (const wire of messages) {
      const message = fromWire(wire);
      released.push(...(conversation.order.offer(message, this.isOwn(message)) ?? []));
    }
    conversation.order.raiseTarget(latestSeq);
    this.release(conversation, released);
    this.checkGap(conversation);
    const entry = this.rooms.get(room);
    if (entry) {
      for (const waiter of entry.waiters) waiter.resolve({ room, latestSeq });
      entry.waiters = [];
    }
    this.resuming?.rooms.delete(room);
    this.maybeResumed();
  }

  private onSyncHint(name: string, latestSeq: bigint): void {
    const conversation = this.conversation(name);
    // Nothing known of it: start just before the hinted message rather than replay it all.
    if (conversation.order.cursor === undefined) {
      this.release(conversation, conversation.order.setBaseline(latestSeq > 0n ? latestSeq - 1n : 0n));
    }
    conversation.order.raiseTarget(latestSeq);
    if (conversation.order.lacking) this.pull(conversation);
  }

  /** After connecting: where does each direct and group conversation stand? (`sync`, limit 1.) */
  private probe(): void {
    this.request({ case: "sync", value: { cursors: [], limit: 1 } }, "syncReply", false).then(
      (frame) => {
        const entries = frame.body.case === "syncReply" ? frame.body.value.conversations : [];
        for (const entry of entries) this.applySync(entry, true);
        if (this.resuming) this.resuming.probe = false;
        this.maybeResumed();
      },
      (error: unknown) => {
        if (error instanceof ServerError) this.notify("error", error);
        if (this.resuming) this.resuming.probe = false;
        this.maybeResumed();
      },
    );
  }

  /**
   * Applies one conversation of a sync reply. `fromServerCursor`: the reply started at the
   * server's cursor of this device (the probe), so its completeness says nothing about ours
   * unless we had no position of our own.
   */
  private applySync(entry: ConversationSync, fromServerCursor: boolean): void {
    const conversation = this.conversation(entry.conversation);
    const order = conversation.order;
    const released: Release<HeraldMessage>[] = [];
    const trustComplete = !fromServerCursor || order.cursor === undefined;
    if (order.cursor === undefined) {
      const first = entry.messages[0];
      released.push(...order.setBaseline(first ? first.seq - 1n : entry.completeThroughSeq));
    }
    for (const wire of entry.messages) {
      const message = fromWire(wire);
      released.push(...(order.offer(message, this.isOwn(message)) ?? []));
    }
    order.raiseTarget(entry.latestSeq);
    if (trustComplete) released.push(...order.completeThrough(entry.completeThroughSeq));
    this.release(conversation, released);
    this.checkGap(conversation);
  }

  /** Arms the gap timer of a conversation that lacks something, or disarms it. */
  private checkGap(conversation: Conversation): void {
    if (!conversation.order.lacking) {
      clearTimeout(conversation.gapTimer);
      conversation.gapTimer = undefined;
      conversation.pullDelayMs = this.gapTimeoutMs();
      return;
    }
    if (conversation.pulling || conversation.gapTimer || this.currentState !== "connected") return;
    // Wait a moment first: the missing message is often our own send's ack, or a push on its way.
    const at = conversation.order.cursor;
    conversation.gapTimer = setTimeout(() => {
      conversation.gapTimer = undefined;
      if (conversation.order.cursor !== at) this.checkGap(conversation);
      else if (conversation.order.lacking) this.pull(conversation);
    }, conversation.pullDelayMs);
  }

  /** Pulls what follows the cursor with `sync`, until the gap is closed. */
  private pull(conversation: Conversation): void {
    const from = conversation.order.cursor;
    if (this.currentState !== "connected" || conversation.pulling || from === undefined) return;
    clearTimeout(conversation.gapTimer);
    conversation.gapTimer = undefined;
    conversation.pulling = true;
    const cursors = [{ conversation: conversation.name, seq: from }];
    this.request({ case: "sync", value: { cursors, limit: 0 } }, "syncReply", false).then(
      (frame) => {
        conversation.pulling = false;
        const entries = frame.body.case === "syncReply" ? frame.body.value.conversations : [];
        const entry = entries.find((candidate) => candidate.conversation === conversation.name);
        if (entry) this.applySync(entry, false);
        const progressed = (conversation.order.cursor ?? 0n) > from;
        if (!conversation.order.lacking) return;
        if (progressed) {
          conversation.pullDelayMs = this.gapTimeoutMs();
          this.pull(conversation);
        } else {
          // Seqs still being stored on the server: ask again later, less and less often.
          conversation.pullDelayMs = Math.min(MAX_PULL_DELAY_MS, conversation.pullDelayMs * 2);
          this.checkGap(conversation);
        }
      },
      (error: unknown) => {
        conversation.pulling = false;
        if (error instanceof ServerError && error.code !== "unavailable") {
          // It cannot be read (no longer a member, say): stop waiting, release what we hold.
          this.notify("error", error);
          this.release(conversation, conversation.order.releaseAll());
        } else {
          conversation.pullDelayMs = Math.min(MAX_PULL_DELAY_MS, conversation.pullDelayMs * 2);
          this.checkGap(conversation);
        }
      },
    );
  }

  private gapTimeoutMs(): number {
    return Math.max(1, this.options.gapTimeoutMs ?? 250);
  }

  /** Queues released messages for the handlers, in order, behind those already queued. */
  private release(conversation: Conversation, released: Release<HeraldMessage>[]): void {
    for (const step of released) {
      conversation.chain = conversation.chain.then(() => this.handle(conversation, step));
    }
  }

  private async handle(conversation: Conversation, step: Release<HeraldMessage>): Promise<void> {
    if (step.message) {
      const { results, errors } = this.emit("message", step.message);
      const settled = await Promise.allSettled(results);
      for (const outcome of settled) if (outcome.status === "rejected") errors.push(outcome.reason);
      for (const error of errors) this.notify("error", new HandlerError(step.message, { cause: error }));
      // In manual mode the app says when a message is handled; skipped seqs wait for that.
      if (this.options.ack === "manual") return;
    } else if (this.options.ack === "manual") {
      return;
    }
    if (step.seq > 0n) this.markHandled(conversation, step.seq);
  }

  private markHandled(conversation: Conversation, seq: bigint): void {
    if (conversation.handled !== undefined && seq <= conversation.handled) return;
    conversation.handled = seq;
    this.store.set(this.storeKey(conversation.name), seq);
    // Rooms are pushed once and never redelivered: no ack (it would only cost a cursor write).
    if (!conversation.room) this.queueAck(conversation.name, seq);
  }

  private queueAck(conversation: string, seq: bigint): void {
    this.ackDue.set(conversation, seq);
    this.ackTimer ??= setTimeout(() => this.flushAcks(this.socket), this.options.ackDelayMs ?? 25);
  }

  /** Sends the acks due (cumulative, one per conversation); kept for later when offline. */
  private flushAcks(socket: WebSocketLike | undefined): void {
    clearTimeout(this.ackTimer);
    this.ackTimer = undefined;
    if (!socket || socket.readyState !== OPEN || !this.info) return;
    for (const [conversation, seq] of this.ackDue) {
      this.transmitOn(socket, { case: "deliverAck", value: { conversation, seq } }, 0);
    }
    this.ackDue.clear();
  }

  private maybeResumed(): void {
    const resuming = this.resuming;
    if (!resuming || resuming.rooms.size > 0 || resuming.probe) return;
    this.resuming = undefined;
    this.notify("resumed", { offlineMs: resuming.offlineMs, resentSends: resuming.resentSends, rooms: resuming.roomCount });
  }

  // --- plumbing -------------------------------------------------------------------------

  private rid(): number {
    const rid = this.nextRidValue;
    this.nextRidValue = rid >= 0xffff_ffff ? 1 : rid + 1;
    return rid;
  }

  private transmit(body: FrameBody, rid = 0): boolean {
    const socket = this.socket;
    return socket !== undefined && this.transmitOn(socket, body, rid);
  }

  private transmitOn(socket: WebSocketLike, body: FrameBody, rid: number): boolean {
    if (socket.readyState !== OPEN) return false;
    try {
      this.budget.spend();
      socket.send(this.codec.encode(rid, body));
      return true;
    } catch {
      return false; // the close that follows resends what needs it
    }
  }

  private setState(state: ClientState): void {
    if (state === this.currentState) return;
    this.currentState = state;
    this.notify("state", state);
  }

  /** Emits an event; a listener that throws is reported as an `error` event. */
  private notify<K extends keyof ClientEvents>(event: K, value: ClientEvents[K]): void {
    const { errors } = this.emit(event, value);
    if (event === "error") return;
    for (const error of errors) this.emit("error", new HandlerError(undefined, { cause: error }));
  }
}

/** Creates a client and starts connecting. */
export function connect(options: ClientOptions): HeraldClient {
  return new HeraldClient(options).start();
}

/** Stops listening to a socket being let go. Its error handler stays a no-op: `ws` throws an
 * error event nobody listens to, and closing a socket still connecting emits one. */
function detach(socket: WebSocketLike): void {
  socket.onopen = socket.onmessage = socket.onclose = null;
  socket.onerror = () => undefined;
}

/** A random (version 4) UUID, also where crypto.randomUUID is missing (insecure origins). */
export function uuid(): string {
  const crypto = (globalThis as { crypto?: Crypto }).crypto;
  if (crypto?.randomUUID) return crypto.randomUUID();
  const bytes = new Uint8Array(16);
  if (crypto?.getRandomValues) crypto.getRandomValues(bytes);
  else for (let i = 0; i < 16; i++) bytes[i] = Math.floor(Math.random() * 256);
  bytes[6] = (bytes[6]! & 0x0f) | 0x40;
  bytes[8] = (bytes[8]! & 0x3f) | 0x80;
  const hex = Array.from(bytes, (byte) => byte.toString(16).padStart(2, "0")).join("");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}
