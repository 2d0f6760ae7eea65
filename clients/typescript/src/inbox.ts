/**
 * Incoming messages (SPEC.md, "Incoming messages" and "Handlers and acks"): per
 * conversation, the order (seq order, duplicates dropped, gaps held and pulled with `sync`),
 * the handlers (one after another per conversation) and the acks (after the handlers
 * returned, coalesced, kept while offline).
 */
import { fromWire, type Frame, type FrameBody } from "./codec.js";
import { HandlerError, ServerError } from "./errors.js";
import type { ConversationSync, Message as WireMessage } from "./gen/herald/v1/frames_pb.js";
import { ConversationOrder, type Release } from "./order.js";
import type { SeqStore } from "./store.js";
import type { ClientEvents, ClientOptions, HeraldMessage, WebSocketLike } from "./types.js";

type Timer = ReturnType<typeof setTimeout>;

/** Longest wait between pulls of a gap the server cannot close yet (seqs still in flight). */
const MAX_PULL_DELAY_MS = 5_000;

export interface Conversation {
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

/** What the inbox needs of the client. */
export interface InboxHost {
  readonly options: ClientOptions;
  readonly store: SeqStore;
  /** The user and device of the current (or last) session. */
  identity(): { readonly userId: string; readonly deviceId: string } | undefined;
  /** Frames may be written now. */
  connected(): boolean;
  /** An internal `sync` (not written again after a reconnect). */
  pullRequest(body: FrameBody): Promise<Frame>;
  /** Calls the `message` handlers; what they returned and threw. */
  emitMessage(message: HeraldMessage): { results: unknown[]; errors: unknown[] };
  notify<K extends keyof ClientEvents>(event: K, value: ClientEvents[K]): void;
  /** Writes the acks on `socket`; false when it cannot (they are kept for later). */
  writeAcks(socket: WebSocketLike | undefined, acks: Map<string, bigint>): boolean;
  /** The socket acks go to when their delay is over. */
  socket(): WebSocketLike | undefined;
}

export class Inbox {
  private readonly conversations = new Map<string, Conversation>();
  private readonly ackDue = new Map<string, bigint>();
  private ackTimer: Timer | undefined;

  constructor(private readonly host: InboxHost) {}

  /** A conversation's state, created (from the store) when first met. */
  conversation(name: string): Conversation {
    let conversation = this.conversations.get(name);
    if (!conversation) {
      const room = name.startsWith("room:");
      const stored = this.host.store.get(this.storeKey(name));
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

  /** Another user logged in on this client: what is known belongs to the previous one. */
  forgetAll(): void {
    this.conversations.clear();
  }

  /** Resolves once every handler already queued has returned. */
  async idle(): Promise<void> {
    await Promise.all([...this.conversations.values()].map((conversation) => conversation.chain));
  }

  /** The connection is gone: pulls under way are lost with it. */
  dropped(): void {
    for (const conversation of this.conversations.values()) {
      conversation.pulling = false;
      clearTimeout(conversation.gapTimer);
      conversation.gapTimer = undefined;
    }
  }

  /** A new connection: pull the gaps still open. */
  connected(): void {
    for (const conversation of this.conversations.values()) this.checkGap(conversation);
  }

  stop(): void {
    clearTimeout(this.ackTimer);
    this.ackTimer = undefined;
  }

  private storeKey(conversation: string): string {
    return `${this.host.identity()?.userId ?? ""}/${this.host.options.deviceId}/${conversation}`;
  }

  private isOwn(message: WireMessage | HeraldMessage): boolean {
    const me = this.host.identity();
    return message.sender === me?.userId && message.senderDevice === me.deviceId;
  }

  /** A pushed message. */
  incoming(wire: WireMessage): void {
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

  /** This device's own send was stored at `seq`. */
  ownSend(name: string, seq: bigint): void {
    const conversation = this.conversation(name);
    this.release(conversation, conversation.order.markOwn(seq));
    this.checkGap(conversation);
  }

  /** A room joined: where it stands, and the catch-up the server sent with it. */
  subscribed(room: string, latestSeq: bigint, messages: WireMessage[]): void {
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
  }

  syncHint(name: string, latestSeq: bigint): void {
    const conversation = this.conversation(name);
    // Nothing known of it: start just before the hinted message rather than replay it all.
    if (conversation.order.cursor === undefined) {
      this.release(conversation, conversation.order.setBaseline(latestSeq > 0n ? latestSeq - 1n : 0n));
    }
    conversation.order.raiseTarget(latestSeq);
    if (conversation.order.lacking) this.pull(conversation);
  }

  /**
   * Applies one conversation of a sync reply. `fromServerCursor`: the reply started at the
   * server's cursor of this device (the probe), so its completeness says nothing about ours
   * unless we had no position of our own.
   */
  applySync(entry: ConversationSync, fromServerCursor: boolean): void {
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
    if (conversation.pulling || conversation.gapTimer || !this.host.connected()) return;
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
    if (!this.host.connected() || conversation.pulling || from === undefined) return;
    clearTimeout(conversation.gapTimer);
    conversation.gapTimer = undefined;
    conversation.pulling = true;
    const cursors = [{ conversation: conversation.name, seq: from }];
    this.host.pullRequest({ case: "sync", value: { cursors, limit: 0 } }).then(
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
          this.host.notify("error", error);
          this.release(conversation, conversation.order.releaseAll());
        } else {
          conversation.pullDelayMs = Math.min(MAX_PULL_DELAY_MS, conversation.pullDelayMs * 2);
          this.checkGap(conversation);
        }
      },
    );
  }

  private gapTimeoutMs(): number {
    return Math.max(1, this.host.options.gapTimeoutMs ?? 250);
  }

  /** Queues released messages for the handlers, in order, behind those already queued. */
  private release(conversation: Conversation, released: Release<HeraldMessage>[]): void {
    for (const step of released) {
      conversation.chain = conversation.chain.then(() => this.handle(conversation, step));
    }
  }

  private async handle(conversation: Conversation, step: Release<HeraldMessage>): Promise<void> {
    const manual = this.host.options.ack === "manual";
    if (step.message) {
      const { results, errors } = this.host.emitMessage(step.message);
      const settled = await Promise.allSettled(results);
      for (const outcome of settled) if (outcome.status === "rejected") errors.push(outcome.reason);
      for (const error of errors) this.host.notify("error", new HandlerError(step.message, { cause: error }));
    }
    // In manual mode the app says when a message is handled; skipped seqs wait for that.
    if (!manual && step.seq > 0n) this.markHandled(conversation, step.seq);
  }

  /** With `ack: "manual"`: `message` and everything before it are handled. */
  ack(message: HeraldMessage): void {
    const conversation = this.conversations.get(message.conversation);
    const cursor = conversation?.order.cursor;
    if (!conversation || cursor === undefined || message.seq === 0n) return;
    this.markHandled(conversation, message.seq > cursor ? cursor : message.seq);
  }

  private markHandled(conversation: Conversation, seq: bigint): void {
    if (conversation.handled !== undefined && seq <= conversation.handled) return;
    conversation.handled = seq;
    this.host.store.set(this.storeKey(conversation.name), seq);
    // Rooms are pushed once and never redelivered: no ack (it would only cost a cursor write).
    if (!conversation.room) this.queueAck(conversation.name, seq);
  }

  private queueAck(conversation: string, seq: bigint): void {
    this.ackDue.set(conversation, seq);
    this.ackTimer ??= setTimeout(() => this.flushAcks(this.host.socket()), this.host.options.ackDelayMs ?? 25);
  }

  /** Sends the acks due (cumulative, one per conversation); kept for later when offline. */
  flushAcks(socket: WebSocketLike | undefined): void {
    clearTimeout(this.ackTimer);
    this.ackTimer = undefined;
    if (this.ackDue.size > 0 && this.host.writeAcks(socket, this.ackDue)) this.ackDue.clear();
  }
}
