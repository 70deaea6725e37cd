"""What an agent's state may say, checked before root uses any of it: the agent, the relay and the
Client between them are the cluster's (tracer/capture/agents.py). A field of the wrong type, a pid that is
not one of a host's (0 < pid < HOST_PID: pids are numbered per host by it), a name or a list past
its cap: the whole reply is refused (BadReply), counted, and that host read again later."""

from __future__ import annotations

import json
import re

from ...probes.agent import CAPTURE_NAME
from .members import ADDRESS

STATE_BYTES = 16 << 20
MAX_MEMBERS = 4096
MAX_FILES = 64
MAX_SOCKETS = 1 << 16
MAX_SKIPPED = 64
TEXT = 500  # characters of a name or a reason kept
ROLES = ("worker", "scheduler")
SOCKET = re.compile(r"(\d{1,3}(\.\d{1,3}){3}|\[[0-9a-fA-F:.]+\]):\d{1,5}")


class BadReply(ValueError):
    """A reply that breaks its format: a hostile or broken peer."""


def clean_state(raw: bytes, host_pid: int) -> dict:
    """The agent's state ({"info", "files", "sockets"}) with only the fields root uses, each checked."""
    if len(raw) > STATE_BYTES:
        raise BadReply(f"a state of {len(raw)} bytes (at most {STATE_BYTES})")
    try:
        state = json.loads(raw)
    except ValueError:
        raise BadReply("a state that is not JSON") from None
    _need(isinstance(state, dict), "a state that is not a mapping")
    info, files, sockets = state.get("info"), state.get("files"), state.get("sockets", {})
    _need(isinstance(info, dict) and isinstance(files, dict) and isinstance(sockets, dict),
          "a state without its info, files and sockets mappings")
    _need(len(files) <= MAX_FILES and all(isinstance(n, str) and re.fullmatch(CAPTURE_NAME, n) and _count(s)
                                          for n, s in files.items()), "a capture's name or size")
    _need(len(sockets) <= MAX_SOCKETS and all(isinstance(a, str) and SOCKET.fullmatch(a) and _pid(p, host_pid)
                                              for a, p in sockets.items()), "a socket's address or pid")
    return {"info": _info(info, host_pid), "files": dict(files), "sockets": dict(sockets)}


def _info(info: dict, host_pid: int) -> dict:
    members, skipped = info.get("members", []), info.get("skipped", {})
    _need(isinstance(members, list) and len(members) <= MAX_MEMBERS, f"members: not a list of at most {MAX_MEMBERS}")
    _need(isinstance(skipped, dict) and len(skipped) <= MAX_SKIPPED
          and all(isinstance(k, str) and isinstance(v, str) for k, v in skipped.items()), "what it skipped")
    out = {"members": [_member(m, host_pid) for m in members],
           "skipped": {k[:TEXT]: v[:TEXT] for k, v in skipped.items()}}
    for key, check in (("host", _text), ("timens_ns", _int), ("agent_pid", lambda v: _pid(v, host_pid)),
                       ("dir", _text)):
        if key in info:
            _need(check(info[key]), f"its {key}")
            out[key] = info[key]
    return out


def _member(row, host_pid: int) -> dict:
    _need(isinstance(row, dict), "a member that is not a mapping")
    _need(_pid(row.get("pid"), host_pid), f"a member's pid: {str(row.get('pid'))[:50]}")
    _need(_text(row.get("name")) and ADDRESS.fullmatch(row["name"]) and row.get("role") in ROLES,
          "a member's name (its address) or role")
    out = {"pid": row["pid"], "name": row["name"], "role": row["role"], "listen": None, "contact": None,
           "command": []}
    if "joined_ns" in row:
        _need(_int(row["joined_ns"]), "a member's joined_ns")
        out["joined_ns"] = row["joined_ns"]
    return out


def _need(ok, what: str) -> None:
    if not ok:
        raise BadReply(f"a bad state: {what}")


def _int(v) -> bool:
    return type(v) is int and -(1 << 63) <= v < 1 << 63


def _count(v) -> bool:
    return type(v) is int and 0 <= v < 1 << 50


def _pid(v, host_pid: int) -> bool:
    return type(v) is int and 0 < v < host_pid


def _text(v) -> bool:
    return isinstance(v, str) and len(v) <= TEXT
