"""Herald's plugin contract for plugins written in Python (built with componentize-py).

The Python counterpart of the Rust `herald-sdk`: plain functions over the `host` imports of
the `herald:plugin` contract (`proto/wit/herald-plugin.wit`) and constructors for the hooks'
answers. componentize-py generates the low-level bindings (the `wit_world` package) from the
world named on its command line; this module only wraps them.

    import herald_plugin as herald
    from wit_world import exports

    class MessagePolicy(exports.MessagePolicy):
        def check(self, message):
            if b"spam" in message.body:
                return herald.reject("blocked-word", "no spam")
            return herald.allow()

Hooks are methods of a class named after the exported interface (`MessagePolicy`,
`AnnouncePolicy`, `RouteKey`, `Degrade`, `Connect`) in the app module. Herald keeps a pool
of instances and any of them may serve a call: module globals are per instance (fine for a
cache such as `config()`'s, wrong for state that must be shared; that goes in `kv`).

componentize-py runs the app's module-level code once at build time, where the host is not
there: call nothing from this module at import time, only inside hooks.
"""

import tomllib
from typing import Any, Dict, List, Optional, Tuple

from wit_world.imports import host, types

__all__ = [
    "Message",
    "allow",
    "reject",
    "rewrite",
    "kv",
    "rate_limit",
    "now_ms",
    "log",
    "counter_add",
    "config",
    "config_text",
]

#: The message the message-policy hook is given (`sender`, `sender_device`,
#: `conversation`, `kind`, `body` as bytes, `client_msg_id`).
Message = types.Message


# -- Answers of the message-policy hook ---------------------------------------------------


def allow() -> "types.MessageDecision":
    """Let the message through unchanged."""
    return types.MessageDecision_Allow()


def reject(code: str, reason: str, retry_after_ms: Optional[int] = None) -> "types.MessageDecision":
    """Refuse the message: `code` is machine-readable (`blocked-word`), `reason` is sent to
    the client; with `retry_after_ms` the client may retry after that many milliseconds."""
    return types.MessageDecision_Reject(types.Rejection(code=code, reason=reason, retry_after_ms=retry_after_ms))


def rewrite(body: bytes) -> "types.MessageDecision":
    """Replace the message body; the next plugin in the chain sees the new body."""
    return types.MessageDecision_Rewrite(bytes(body))


# -- Capabilities ---------------------------------------------------------------------------


class kv:
    """Key-value storage scoped to this plugin, shared by all its instances (and by every
    node in cluster mode). `ttl_ms` of None keeps a key until it is deleted."""

    @staticmethod
    def get(key: str) -> Optional[bytes]:
        """The value, or None when the key is absent or expired."""
        return host.kv_get(key)

    @staticmethod
    def get_string(key: str) -> Optional[str]:
        """The value decoded as UTF-8 (invalid bytes replaced), or None."""
        value = host.kv_get(key)
        return None if value is None else value.decode("utf-8", errors="replace")

    @staticmethod
    def set(key: str, value: "bytes | str", ttl_ms: Optional[int] = None) -> None:
        """Writes a key (a str is stored as its UTF-8 bytes)."""
        host.kv_set(key, _bytes(value), ttl_ms)

    @staticmethod
    def set_if_absent(key: str, value: "bytes | str", ttl_ms: Optional[int] = None) -> bool:
        """Writes a key only if it is absent: True when this call wrote it (the atomic
        "only once")."""
        return host.kv_set_if_absent(key, _bytes(value), ttl_ms)

    @staticmethod
    def increment(key: str, delta: int = 1, ttl_ms: Optional[int] = None) -> int:
        """Adds `delta` to an integer key (absent = 0) and returns the new value; `ttl_ms`
        applies when the key is created."""
        return host.kv_increment(key, delta, ttl_ms)

    @staticmethod
    def delete(key: str) -> bool:
        """Removes a key: True when it existed."""
        return host.kv_delete(key)


def _bytes(value: "bytes | str") -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def rate_limit(key: str, per_second: float, burst: int) -> Optional[int]:
    """Takes one token from the bucket `key`, refilled at `per_second` up to `burst`.

    None when the token was taken (go ahead); otherwise the milliseconds to wait."""
    decision = host.rate_limit(key, float(per_second), int(burst))
    if isinstance(decision, types.LimitDecision_RetryAfterMs):
        return decision.value
    return None


def now_ms() -> int:
    """The host's wall clock, milliseconds since the Unix epoch."""
    return host.now_ms()


class log:
    """Structured log lines, tagged with the plugin's name by the host:
    `log.info("blocked a message", sender="alice", word="spam")`."""

    @staticmethod
    def _write(level: "types.LogLevel", message: str, fields: Dict[str, Any]) -> None:
        pairs: List[Tuple[str, str]] = [(str(k), str(v)) for k, v in fields.items()]
        host.log(level, message, pairs)

    @staticmethod
    def trace(message: str, **fields: Any) -> None:
        log._write(types.LogLevel.TRACE, message, fields)

    @staticmethod
    def debug(message: str, **fields: Any) -> None:
        log._write(types.LogLevel.DEBUG, message, fields)

    @staticmethod
    def info(message: str, **fields: Any) -> None:
        log._write(types.LogLevel.INFO, message, fields)

    @staticmethod
    def warn(message: str, **fields: Any) -> None:
        log._write(types.LogLevel.WARN, message, fields)

    @staticmethod
    def error(message: str, **fields: Any) -> None:
        log._write(types.LogLevel.ERROR, message, fields)


def counter_add(name: str, delta: int = 1) -> None:
    """Adds to a counter the host exports as `herald_plugin_<name>`."""
    host.counter_add(name, delta)


def config_text() -> str:
    """The plugin's configuration as TOML text (the manifest's `[config]` table merged with
    the operator's overrides); empty when there is none."""
    return host.config()


_CONFIG: Optional[Dict[str, Any]] = None


def config() -> Dict[str, Any]:
    """The plugin's configuration parsed into a dict (empty when there is none).

    Parsed once per instance and cached: the host fixes the configuration for the life of
    an instance. A malformed document raises `tomllib.TOMLDecodeError`, which traps the
    call (the hook's failure policy answers and Herald logs the error)."""
    global _CONFIG
    if _CONFIG is None:
        _CONFIG = tomllib.loads(host.config())
    return _CONFIG
