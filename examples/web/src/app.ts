/**
 * Herald's web chat page on the herald-client library. Everything the protocol asks of a
 * client (resends with the same client_msg_id, order and gaps, acks after display, rooms
 * caught up after reconnects, dead-server detection, go_away) is the library's; the page
 * only shows what the library hands it. Seqs are kept in localStorage, so a reloaded page
 * (or a reconnect after Disconnect) resumes instead of replaying history.
 */
import {
  HeraldClient,
  LocalStorageSeqStore,
  SendRejectedError,
  type ClientState,
  type HeraldMessage,
} from "herald-client";
import { $, appendPending, buildMessage, el, note, place, prependOlder, setStored } from "./view.js";

const NAME = /^[A-Za-z0-9._@-]{1,128}$/;
/** The kind herald-chat uses for UTF-8 text. */
const TEXT_KIND = 1;

/** What scripts (and tests) can read of the page: `window.heraldChat`. */
const chat: {
  state: string;
  user: string | null;
  conversation: string | null;
  client: HeraldClient | undefined;
} = { state: "disconnected", user: null, conversation: null, client: undefined };
(window as unknown as { heraldChat: typeof chat }).heraldChat = chat;

/** Rooms joined on this page: joined again by the next client after Disconnect/Connect. */
const rooms = new Set<string>();
/** Ids of the messages shown, so a history page that overlaps them adds nothing twice. */
const shownIds = new Set<string>();
/** Per conversation: the seq to page history before ("" once the beginning was reached). */
const historyBefore = new Map<string, string>();

function wsUrl(): string {
  const override = new URLSearchParams(location.search).get("ws");
  if (override) return override;
  return `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/v1/ws`;
}

function dmConversation(a: string, b: string): string {
  // Byte-wise order of the UTF-8 names; names are ASCII, so code-unit order is byte order.
  return a < b ? `dm:${a}:${b}` : `dm:${b}:${a}`;
}

const STATES: Record<ClientState, string> = {
  idle: "disconnected",
  connecting: "connecting",
  connected: "connected",
  reconnecting: "reconnecting",
  closed: "disconnected",
};

function showState(state: ClientState): void {
  const shown = STATES[state];
  chat.state = shown;
  el.status.dataset.state = shown;
  el.status.textContent = state === "connected" && chat.user ? `connected as ${chat.user}` : shown;
  const live = state !== "idle" && state !== "closed";
  el.connect.disabled = live;
  el.disconnect.disabled = !live;
  el.user.disabled = el.device.disabled = live;
  // Sends and history requests made while reconnecting wait in the library.
  el.send.disabled = !live;
  el.history.disabled = !live;
}

function shownMessage(message: HeraldMessage): HTMLLIElement {
  return buildMessage({
    conversation: message.conversation,
    sender: message.sender,
    text: textOf(message),
    seq: message.seq,
    id: message.id.toString(),
    direction: message.sender === chat.user ? "out" : "in",
    status: "ok",
  });
}

function textOf(message: HeraldMessage): string | undefined {
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(message.body);
  } catch {
    return undefined;
  }
}

/** The library hands each message once, in order; it is acked once this returns. */
function onMessage(message: HeraldMessage): void {
  const id = message.id.toString();
  if (message.id !== 0n) {
    if (shownIds.has(id)) return;
    shownIds.add(id);
  }
  place(shownMessage(message));
}

function connect(): void {
  const user = el.user.value.trim();
  const device = el.device.value.trim() || "web";
  if (!NAME.test(user) || !NAME.test(device)) {
    note("user and device must be 1-128 characters of A-Z a-z 0-9 . _ @ -", true);
    return;
  }
  chat.user = user;
  const client = new HeraldClient({
    url: wsUrl(),
    token: `dev:${user}`,
    deviceId: device,
    store: new LocalStorageSeqStore(),
    clientInfo: { name: "herald-web", version: "0.2.0" },
    onMessage,
  });
  chat.client = client;
  client.on("state", (state) => {
    if (chat.client === client) showState(state);
  });
  client.on("connected", (info) => note(`connected as ${info.userId} (device ${info.deviceId}, node ${info.nodeId})`));
  client.on("disconnected", (info) => {
    const why = `${info.code}${info.reason ? ` ${info.reason}` : ""}`;
    if (info.willReconnect) {
      note(`connection closed (${why}); reconnecting in ${((info.reconnectInMs ?? 0) / 1000).toFixed(1)} s`, info.code !== 1000);
    } else if (info.code === 4009) {
      note("this user and device connected elsewhere (4009)", true);
    } else if (info.code === 4001 || info.code === 4003) {
      note(`server refused the login (${why}); is it running with --dev?`, true);
    } else {
      note(`disconnected (${why})`);
    }
  });
  client.on("resumed", (info) =>
    note(`back after ${(info.offlineMs / 1000).toFixed(1)} s: ${info.resentSends} send(s) resent, ${info.rooms} room(s) caught up`),
  );
  client.on("goAway", (info) =>
    note(`server going away: ${info.reason || "draining"}${info.reconnectUrl ? `; moving to ${info.reconnectUrl}` : ""}`),
  );
  client.on("retry", (info) => note(`server busy: message resent in ${info.retryAfterMs} ms`));
  client.on("error", (error) => note(error.message, true));
  client.start();
  for (const room of rooms) join(room);
}

async function disconnect(): Promise<void> {
  const client = chat.client;
  if (!client) return;
  await client.close();
  showState("closed");
}

function join(room: string): void {
  const client = chat.client;
  if (!client) return;
  client.subscribe(room).then(
    (joined) => note(`joined ${joined.room} (latest #${joined.latestSeq})`),
    (error: Error) => {
      rooms.delete(room);
      note(`could not join ${room}: ${error.message}`, true);
    },
  );
}

/** The conversation #peer names (a user, `room:…`, `grp:…` or `dm:…`), made current. */
function pickConversation(): string | null {
  const value = el.peer.value.trim();
  if (!value) return null;
  if (!chat.user || !chat.client) {
    note("connect first", true);
    return null;
  }
  let conversation: string;
  if (value.startsWith("room:") || value.startsWith("grp:") || value.startsWith("dm:")) {
    conversation = value;
  } else if (NAME.test(value)) {
    if (value === chat.user) {
      note("that is you: pick another user", true);
      return null;
    }
    conversation = dmConversation(chat.user, value);
  } else {
    note("peer must be a user name, room:<name> or grp:<id>", true);
    return null;
  }
  if (conversation !== chat.conversation) {
    chat.conversation = conversation;
    el.conversation.dataset.conversation = conversation;
    el.conversation.textContent = conversation;
  }
  if (conversation.startsWith("room:") && !rooms.has(conversation)) {
    rooms.add(conversation);
    join(conversation);
  }
  return conversation;
}

async function sendText(): Promise<void> {
  const text = el.text.value;
  const client = chat.client;
  if (!text.trim() || !client) return;
  const conversation = pickConversation();
  if (!conversation) return;
  const li = buildMessage({
    conversation,
    sender: chat.user ?? "",
    text,
    seq: 0n,
    id: "",
    direction: "out",
    status: "pending",
  });
  appendPending(li);
  el.text.value = "";
  el.text.focus();
  try {
    // Resent with the same client_msg_id across RETRYs and reconnects: one call, one message.
    const sent = await client.send(conversation, text, { kind: TEXT_KIND });
    shownIds.add(sent.messageId.toString());
    setStored(li, sent.conversation, sent.seq, sent.messageId.toString(), "ok");
    place(li);
  } catch (error) {
    const rejected = error instanceof SendRejectedError;
    li.dataset.status = rejected ? "rejected" : "failed";
    const why = document.createElement("div");
    why.className = "why";
    why.textContent = rejected ? `REJECTED: ${error.reason || "no reason given"}` : (error as Error).message;
    li.appendChild(why);
    note(`message to ${conversation} ${why.textContent}`, true);
  }
}

async function olderMessages(): Promise<void> {
  const conversation = pickConversation();
  const client = chat.client;
  if (!conversation || !client) return;
  const before = historyBefore.get(conversation);
  if (before === "") {
    note(`no older messages in ${conversation}`);
    return;
  }
  try {
    const page = await client.history(conversation, { beforeSeq: BigInt(before ?? "0"), limit: 20 });
    const older = page.messages.filter((m) => !shownIds.has(m.id.toString()));
    for (const m of older) shownIds.add(m.id.toString());
    prependOlder(older.map(shownMessage));
    const oldest = page.messages[0];
    historyBefore.set(conversation, page.hasMore && oldest ? oldest.seq.toString() : "");
    note(
      page.messages.length
        ? `${page.messages.length} older message(s) of ${conversation}${page.hasMore ? "" : "; beginning reached"}`
        : `no older messages in ${conversation}`,
    );
  } catch (error) {
    note(`history of ${conversation}: ${(error as Error).message}`, true);
  }
}

$("login-form").addEventListener("submit", (event) => {
  event.preventDefault();
  connect();
});
el.disconnect.addEventListener("click", () => void disconnect());
$("peer-form").addEventListener("submit", (event) => {
  event.preventDefault();
  pickConversation();
});
el.peer.addEventListener("change", () => void pickConversation());
el.history.addEventListener("click", () => void olderMessages());
$("compose-form").addEventListener("submit", (event) => {
  event.preventDefault();
  void sendText();
});
showState("idle");
