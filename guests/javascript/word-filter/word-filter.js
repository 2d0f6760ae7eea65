// word-filter: rejects a message whose body contains a blocked word.
//
// The JavaScript twin of the Rust template `herald plugin new` writes: the body is decoded
// as UTF-8 (invalid bytes replaced) and lower-cased, and the first word of `blocked_words`
// (manifest `[config]`) found in it rejects the message with code `blocked-word`.
//
// Built by scripts/lib.sh (`build_language_guests`) with
// `jco componentize --bundle word-filter.js --wit proto/wit --world-name message-policy-plugin`.

import * as herald from '../herald-plugin.js';

function blockedWords() {
  const words = herald.config().blocked_words ?? [];
  return words.map(String);
}

export const messagePolicy = {
  check(message) {
    const text = herald.bodyText(message).toLowerCase();
    for (const word of blockedWords()) {
      if (text.includes(word)) {
        herald.log.info('blocked a message', { sender: message.sender, word });
        return herald.reject('blocked-word', `messages may not contain \`${word}\``);
      }
    }
    return herald.allow();
  },
};
