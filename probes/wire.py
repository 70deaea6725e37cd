"""Decode captured Dask messages into ops, safely: msgpack only, no object
hooks, nothing is ever unpickled (pickled fields stay opaque bytes)."""

from __future__ import annotations

import msgpack


class Undecodable(ValueError):
    pass


# What msgpack raises on bytes a peer made up: a map as a map key (TypeError), nesting
# past its limit, truncation, trailing bytes.
_MALFORMED = (ValueError, TypeError, RecursionError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError)


def _unpack(raw: bytes):
    # use_list=False: heartbeats carry tuple keys in maps.
    return msgpack.unpackb(raw, raw=False, strict_map_key=False, use_list=False)


def decode(frames: dict[int, bytes], framing: str):
    """The message object from the kept frames of one captured message."""
    try:
        if framing == "legacy":
            header = _unpack(frames[0]) if frames.get(0) else {}
            if isinstance(header, dict) and header.get("compression"):
                raise Undecodable(f"2.x payload compressed with {header['compression']}")
            return _unpack(frames.get(1, b""))
        return _unpack(frames[0])
    except KeyError as e:
        raise Undecodable(f"frame {e} was not captured") from None
    except _MALFORMED as e:
        raise Undecodable(f"{type(e).__name__}: {e}") from None


def decode_frame0(raw: bytes):
    """The message object of a current-framing message from its frame 0 alone."""
    try:
        return _unpack(raw)
    except _MALFORMED as e:
        raise Undecodable(f"{type(e).__name__}: {e}") from None


def key_str(key) -> str:
    """Dask keys are str, bytes or (nested) tuples; render them as dask does with str()."""
    if isinstance(key, bytes):
        return key.decode("utf-8", "replace")
    return key if isinstance(key, str) else str(key)


def keys_of(op: dict) -> tuple:
    keys = op.get("keys")
    if isinstance(keys, dict):  # {"__Set__": True, "as-list": [...]}, or who_has-style maps
        keys = keys.get("as-list", tuple(keys))
    return tuple(keys) if isinstance(keys, (list, tuple)) else ()


def is_handshake(msg) -> bool:
    return isinstance(msg, dict) and "op" not in msg and {"compression", "python"} <= msg.keys()
