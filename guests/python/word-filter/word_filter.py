"""word-filter: rejects a message whose body contains a blocked word.

The Python twin of the Rust template `herald plugin new` writes: the body is decoded as
UTF-8 (invalid bytes replaced) and lower-cased, and the first word of `blocked_words`
(manifest `[config]`) found in it rejects the message with code `blocked-word`.

Build (from the repository root; scripts/lib.sh does this in `build_language_guests`):

    componentize-py -d proto/wit -w message-policy-plugin componentize \\
        -p guests/python/word-filter -p guests/python word_filter -o word_filter_py.wasm
"""

from typing import List

import herald_plugin as herald
from wit_world import exports


def blocked_words() -> List[str]:
    """The `blocked_words` setting; none when the config does not give it."""
    return [str(word) for word in herald.config().get("blocked_words", [])]


class MessagePolicy(exports.MessagePolicy):
    def check(self, message: herald.Message):
        text = message.body.decode("utf-8", errors="replace").lower()
        for word in blocked_words():
            if word in text:
                herald.log.info("blocked a message", sender=message.sender, word=word)
                return herald.reject("blocked-word", f"messages may not contain `{word}`")
        return herald.allow()
