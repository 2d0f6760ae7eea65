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
import type { Message as WireMessage } from "./gen/herald/v1/frames_pb.js";
import { Inbox } from "./inbox.js";
import { FrameBudget, SendWindow } from "./pacing.js";
import { Requests } from "./requests.js";
import { Resumption } from "./resumption.js";
import { Rooms, roomName } from "./rooms.js";
import { SendQueue } from "./sends.js";
import { OPEN, detach } from "./socket.js";
import { MemorySeqStore, type SeqStore } from "./store.js";
import { TokenSource } from "./tokens.js";
import { uuid } from "./uuid.js";
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

/** Client-side close code for a socket the client dropped itself (silent server, timeout). */
const CLIENT_DROP = 4000;
/** Close codes after which reconnecting would not help (or would fight another device). */
const FATAL_CLOSES = new Set([4003, 4009]);
/** A connection that held this long counts as good: the backoff starts over after it. */
const STABLE_AFTER_MS = 5_000;
/** The server answers within `heartbeat_ms`; the margin for the network (PROTOCOL.md). */
const HEARTBEAT_MARGIN_MS = 3_000;

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
  private readonly tokens: TokenSource;
  private goAway: { reconnectAfterMs: number; reconnectUrl: string } | undefined;

  private reconnectTimer: Timer | undefined;
  private connectTimer: Timer | undefined;
  private tickTimer: ReturnType<typeof setInterval> | undefined;
  private goAwayTimer: Timer | undefined;
  private lastHeardAt = 0;
  private lastPingAt = 0;
  private connectedAt = 0;
  private droppedAt = 0;
  private silenceLimitMs = 0;
  private pingWhenSilent = true;
  /** The server asks for the pongs it needs (`Ping.reply`); an older one wants every ping answered. */
  private serverAsks = false;
  private nextRidValue = 1;

  private readonly budget: FrameBudget;
  private readonly sends: SendQueue;
  private readonly inbox: Inbox;
  private readonly requests: Requests;
  private readonly rooms: Rooms;
  private readonly resumption = new Resumption((info) => this.notify("resumed", info));

  constructor(options: ClientOptions) {
    super();
    this.options = options;
    this.codec = options.codec ?? protoCodec;
    this.store = options.store ?? new MemorySeqStore();
    this.backoff = new Backoff(options.reconnect, options.random);
    this.url = options.url;
    this.tokens = new TokenSource(options.token);
    this.deadAfterMs = options.deadAfterMs ?? 15_000;
    this.budget = new FrameBudget(options.maxFramesPerSecond ?? 1_800);
    this.sends = new SendQueue(
      {
        connected: () => this.currentState === "connected",
        transmit: (body, rid) => this.transmit(body, rid),
        rid: () => this.rid(),
        notify: (event, value) => this.notify(event, value),
        stored: (conversation, seq) => this.inbox.ownSend(conversation, seq),
      },
      new SendWindow(options.maxInFlightSends ?? 1_000),
      this.budget,
    );
    this.requests = new Requests({
      state: () => (this.currentState === "connected" || this.currentState === "closed" ? this.currentState : "waiting"),
      transmit: (body, rid) => this.transmit(body, rid),
      rid: () => this.rid(),
    });
    this.rooms = new Rooms({
      connected: () => this.currentState === "connected",
      transmit: (body, rid) => this.transmit(body, rid),
      rid: () => this.rid(),
      cursor: (room) => this.inbox.conversation(room).order.cursor,
    });
    this.inbox = new Inbox({
      options,
      store: this.store,
      identity: () => this.info,
      connected: () => this.currentState === "connected",
      pullRequest: (body) => this.requests.ask(body, "syncReply", false),
      emitMessage: (message) => this.emit("message", message),
      notify: (event, value) => this.notify(event, value),
      writeAcks: (socket, acks) => this.writeAcks(socket, acks),
      socket: () => this.socket,
    });
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
    return this.sends.add(clientMsgId, conversation, options.kind ?? 0, bytes, options.timeoutMs);
  }

  /**
   * Joins a room (`room:<name>`, or just `<name>`) for as long as the client lives or until
   * `unsubscribe`. After every reconnect it is joined again from the last seq seen
   * (`since_seq`), so nothing stored in between is missed.
   */
  subscribe(room: string): Promise<{ room: string; latestSeq: bigint }> {
    if (this.currentState === "closed") return Promise.reject(new ConnectionClosedError(1000, "client closed"));
    return this.rooms.join(roomName(room));
  }

  /** Leaves a room; its last seq is kept, so joining it again later catches up from there. */
  unsubscribe(room: string): void {
    this.rooms.leave(roomName(room));
  }

  /** A page of history before `beforeSeq` (default: the latest), ascending. */
  async history(conversation: string, options: { beforeSeq?: bigint; limit?: number } = {}): Promise<HistoryPage> {
    const frame = await this.requests.ask(
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
    const frame = await this.requests.ask({ case: "sync", value: { cursors, limit } }, "syncReply", true);
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
    this.inbox.ack(message);
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
    await this.inbox.idle();
    this.inbox.flushAcks(socket);
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
      token = await this.tokens.current();
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
      const refusals = this.tokens.refused();
      fatal ||= this.tokens.fixed || refusals >= (this.options.maxAuthFailures ?? 3);
      delay = refusals === 1 ? 0 : this.backoff.next();
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
    this.sends.dropped();
    this.requests.dropped(code, reason);
    this.rooms.dropped();
    this.inbox.dropped();
    this.resumption.cancel();
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
    this.inbox.stop();
    this.clearConnectionTimers();
    this.resetConnectionState(cause.code, cause.reason);
    this.sends.abandonAll(cause);
    this.requests.closed(cause);
    this.rooms.closed(cause);
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
        return this.sends.onSendAck(body.value);
      case "deliver":
        if (body.value.message) this.inbox.incoming(body.value.message);
        return;
      case "syncReply":
      case "historyReply":
        return this.requests.reply(frame);
      case "subscribed":
        return this.onSubscribed(frame.rid, body.value.room, body.value.latestSeq, body.value.messages);
      case "syncHint":
        return this.inbox.syncHint(body.value.conversation, body.value.latestSeq);
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
    if (this.info && this.info.userId !== connected.userId) this.inbox.forgetAll();
    this.everConnected = true;
    this.tokens.accepted();
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
    if (reconnect) {
      const probe = this.options.catchUpOnConnect !== false;
      this.resumption.begin(Date.now() - this.droppedAt, this.sends.size, this.rooms.names(), probe);
    }
    this.rooms.rejoinAll();
    if (this.options.catchUpOnConnect !== false) this.probe();
    this.requests.connected();
    this.sends.pump();
    this.inbox.flushAcks(this.socket);
    this.inbox.connected();
    this.resumption.check();
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
    this.inbox.flushAcks(this.socket);
    // The server closes with 1012 right after; if that close gets lost, drop it ourselves.
    this.goAwayTimer = setTimeout(() => this.abandon(reason), 2_000);
  }

  private onServerError(rid: number, code: string, message: string): void {
    const error = new ServerError(code, message, rid);
    if (this.requests.failed(rid, error)) return;
    const room = this.rooms.refused(rid, error);
    if (room !== undefined) this.resumption.roomDone(room);
    this.notify("error", error);
  }

  // --- rooms and catch-up ---------------------------------------------------------------

  private onSubscribed(rid: number, room: string, latestSeq: bigint, messages: WireMessage[]): void {
    this.inbox.subscribed(room, latestSeq, messages);
    this.rooms.subscribed(rid, room, latestSeq);
    this.resumption.roomDone(room);
  }

  /** After connecting: where does each direct and group conversation stand? (`sync`, limit 1.) */
  private probe(): void {
    this.requests.ask({ case: "sync", value: { cursors: [], limit: 1 } }, "syncReply", false).then(
      (frame) => {
        const entries = frame.body.case === "syncReply" ? frame.body.value.conversations : [];
        for (const entry of entries) this.inbox.applySync(entry, true);
        this.resumption.probeDone();
      },
      (error: unknown) => {
        if (error instanceof ServerError) this.notify("error", error);
        this.resumption.probeDone();
      },
    );
  }

  // --- plumbing -------------------------------------------------------------------------

  private rid(): number {
    const rid = this.nextRidValue;
    this.nextRidValue = rid >= 0xffff_ffff ? 1 : rid + 1;
    return rid;
  }

  /** Writes the acks on `socket` if it can carry them (open, after a `connected`). */
  private writeAcks(socket: WebSocketLike | undefined, acks: Map<string, bigint>): boolean {
    if (!socket || socket.readyState !== OPEN || !this.info) return false;
    for (const [conversation, seq] of acks) this.transmitOn(socket, { case: "deliverAck", value: { conversation, seq } }, 0);
    return true;
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
