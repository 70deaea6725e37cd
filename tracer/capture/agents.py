"""The recorder's side of the per-host agents (probes/agent.py) on an attached cluster's other
hosts: deployed as plugins through a Client; read as they go (every STREAM_S, what is new) and at
the end, in chunks, through that Client into run/hosts/HOST/; each host's CLOCK_MONOTONIC offset
to the recorder's estimated at every read.

The Client is not root's: it unpickles what the cluster sends, so it lives in a child process run
as the cluster's user (tracer/capture/agent_relay.py), which hands the agents' replies over a pipe as bytes
and JSON. Root trusts none of it: each reply is size-capped and checked field by field (BadReply),
a host's captures are capped in all (HOST_BYTES), and a bad reply costs that host's read, counted
in run.json (`bad_replies`), never the recording."""

from __future__ import annotations

import json
import os
import pwd
import re
import select
import struct
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from ...probes.agent import CAPTURE_NAME, CHUNK
from ...probes.rates import Sampling
from ...probes.rundir import RunDir, open_append, write_new
from ...probes.schema import HOST_PID
from .agent_replies import BadReply, clean_state
from .members import ADDRESS

HOST_NAME = re.compile(r"[A-Za-z0-9_:.-]{1,255}")
HOST_BYTES = 1 << 30  # all of a host's captures: more is not read, and run.json says so
REPLY_BYTES = CHUNK + (1 << 20)  # one reply: a chunk of a capture, or the agent's state
MAX_HOSTS = 4096
ATTEMPTS = 2  # tries of a host's read per pull; one that failed is tried again at the next pull
REQUEST_S = 120.0  # a relay that says nothing for this long is hung: it is ended
LOG_BYTES = 1 << 20  # of the relay's own messages (Dask's logging) kept in logs/agents.log
NOBODY = 65534


class Agents:
    """Plugins on the cluster at `address` that start an agent on each host not in `here`, through a
    relay run as `user` (uid, gid; None: ours)."""

    def __init__(self, address: str, here: set[str], sampling: Sampling, log: Path,
                 user: tuple[int, int] | None = None):
        self.run_id, self.here, self.log = uuid.uuid4().hex[:12], set(here), log
        self.seen: dict[str, dict] = {}  # host -> what its agent said, its clock, whether it was read to the end
        self.offsets: dict[tuple[str, str], int] = {}  # (host, capture) -> bytes read
        self.relay = _start_relay(user, log)
        try:
            self._request("start", address=address, run_id=self.run_id, sampling=sampling, here=sorted(self.here))
        except BaseException:  # a Ctrl-C too: no plugin may stay behind to start agents later
            self.close()
            raise

    def _request(self, do: str, **fields) -> tuple[dict, bytes]:
        """One request to the relay: (its JSON header, its bytes), both checked for size; RuntimeError
        with the relay's words if it failed there; BadReply if the relay broke the format."""
        if self.relay.poll() is not None:
            raise RuntimeError(f"the relay ended (exit code {self.relay.returncode}; logs/agents.log says why)")
        self.relay.stdin.write(json.dumps({"do": do, **fields}).encode() + b"\n")
        self.relay.stdin.flush()
        size = struct.unpack("<Q", self._exactly(8))[0]
        if size > REPLY_BYTES:
            self._end_relay()
            raise BadReply(f"a reply of {size} bytes (at most {REPLY_BYTES})")
        header, _, data = self._exactly(size).partition(b"\n")
        try:
            header = json.loads(header)
        except ValueError:
            raise BadReply("a reply whose header is not JSON") from None
        if not isinstance(header, dict):
            raise BadReply("a reply whose header is not a mapping")
        if "error" in header:
            raise RuntimeError(str(header["error"])[:1000])
        return header, data

    def _exactly(self, n: int) -> bytes:
        buf, deadline, out = bytearray(), time.monotonic() + REQUEST_S, self.relay.stdout
        while len(buf) < n:
            if not select.select([out], [], [], max(0.0, deadline - time.monotonic()))[0]:
                self._end_relay()
                raise TimeoutError(f"the relay said nothing for {REQUEST_S:g} s: ended")
            got = os.read(out.fileno(), min(n - len(buf), 1 << 20))
            if not got:
                raise RuntimeError(f"the relay ended (exit code {self.relay.wait(5)}; logs/agents.log says why)")
            buf += got
        return bytes(buf)

    def _end_relay(self) -> None:
        """A relay that broke the format or hung cannot be read in step again."""
        self.relay.kill()
        self.relay.wait()

    def hosts(self) -> dict[str, tuple[str, bool]]:
        """Each host with an agent: (a member there to ask it through, whether that is the scheduler)."""
        there = self._request("hosts")[0].get("hosts")
        if not isinstance(there, dict) or len(there) > MAX_HOSTS:
            raise BadReply("its hosts are not a mapping of at most {MAX_HOSTS}")
        out = {}
        for host, member in there.items():
            if not (isinstance(member, list) and len(member) == 2 and isinstance(member[0], str)
                    and ADDRESS.fullmatch(member[0]) and isinstance(member[1], bool)):
                raise BadReply(f"a member to ask through that is not an address: {str(member)[:200]}")
            if HOST_NAME.fullmatch(host) and host not in (".", "..") and host not in self.here:
                out[host] = (member[0], member[1])
        return out

    def _ask(self, member: tuple[str, bool], *words: str) -> bytes:
        return self._request("ask", member=list(member), words=list(words))[1]

    def pull(self, run: RunDir, ports: dict[int, str], final: bool = False) -> None:
        """What each agent captured since the last pull (final: all of it, its probes stopped
        first, then the agent ended). Each agent's tap watches `ports` (port -> the member's name,
        the cluster's now) from then on. A host whose read fails is tried again (and at the next
        pull: each read renews its agent's lease); one that no longer has a member to ask through
        keeps what was read before, marked incomplete."""
        try:
            hosts = self.hosts()
        except Exception as e:  # the scheduler gone: each host keeps what was read, and run.json says so
            self._bad(None, e) if isinstance(e, BadReply) else self._note(f"the relay could not list the hosts: {e}")
            for seen in self.seen.values() if final else ():
                seen.setdefault("error", f"the scheduler did not answer ({type(e).__name__}: {e})")
            return
        for host, member in hosts.items():
            seen = self.seen.setdefault(host, {"complete": False})
            tries = 1 if "error" in seen and not final else ATTEMPTS  # a hung agent stalls a pull once
            for _ in range(tries):
                try:
                    self._read_host(run, host, member, ports, final)
                    seen.pop("error", None)
                    break
                except Exception as e:  # this host only: the member gone meanwhile, its agent dead or not ours
                    seen["error"] = f"{type(e).__name__}: {e}"[:1000]
                    self._note(f"reading {host} failed: {seen['error']}")
                    seen["failed_reads"] = seen.get("failed_reads", 0) + 1
                    if isinstance(e, BadReply):
                        self._bad(host, e)
                    if self.relay.poll() is not None:
                        return

    def _read_host(self, run: RunDir, host: str, member, ports: dict[int, str], final: bool) -> None:
        seen = self.seen[host]
        self._clock(host, member)
        if not final:
            self._ask(member, "ports", *(f"{p}={n}" for p, n in sorted(ports.items())))
        state = clean_state(self._ask(member, "stop" if final else "state"), HOST_PID)
        seen.update(state["info"])
        seen.setdefault("sockets", {}).update(state["sockets"])
        for name, size in state["files"].items():
            self._fetch(run, host, member, name, size)
        if final:
            self._ask(member, "done")
            seen["complete"] = True

    def _bad(self, host: str | None, e: Exception) -> None:
        """Counted in the host's run.json entry, and logged."""
        if host:
            self.seen[host]["bad_replies"] = self.seen[host].get("bad_replies", 0) + 1
        self._note(f"a bad reply from {host or 'the relay'}: {e}")

    def _note(self, what: str) -> None:
        try:
            with open_append(self.log) as f:
                f.write(f"daskprobe: {what}"[:2000].encode() + b"\n")
        except OSError:
            pass

    def _clock(self, host: str, member) -> None:
        """The host's offset (the recorder's clock minus its, ns) and uncertainty from the round trip
        with the shortest time so far; the host read its clock somewhere within it."""
        best = self.seen[host].get("rtt_ns", float("inf"))
        trips = self._request("clock", member=list(member))[0].get("clock")
        if not isinstance(trips, list) or not trips or len(trips) > 100:
            raise BadReply("its clock exchanges are not a list")
        for trip in trips:
            if not (isinstance(trip, list) and len(trip) == 3 and all(type(t) is int and 0 <= t < 1 << 63 for t in trip)
                    and 0 <= trip[2] - trip[0] < 60_000_000_000):
                raise BadReply(f"a clock exchange that is not three times in order: {str(trip)[:200]}")
            t0, theirs, t1 = trip
            if t1 - t0 < best:
                best = t1 - t0
                self.seen[host].update(rtt_ns=best, offset_ns=(t0 + t1) // 2 - theirs, uncertainty_ns=best // 2)

    def _fetch(self, run: RunDir, host: str, member, name: str, size: int) -> None:
        """The capture's bytes from where the last read stopped to `size`, each chunk appended (and
        counted) as it comes: a read that fails midway is taken up where it stopped."""
        if not re.fullmatch(CAPTURE_NAME, name):  # whoever answers, nothing is written outside hosts/HOST/
            raise BadReply(f"a capture named {name[:100]!r}")
        dest = run / "hosts" / host / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        at = self.offsets.get((host, name), 0)
        with open_append(dest) as f:
            while at < size:
                if sum(v for (h, _), v in self.offsets.items() if h == host) >= HOST_BYTES:
                    self.seen[host]["truncated"] = f"its captures passed {HOST_BYTES >> 20} MiB: the rest was not read"
                    return
                chunk = self._ask(member, "read", name, str(at))
                if not chunk:
                    break
                if len(chunk) > CHUNK:
                    raise BadReply(f"a chunk of {len(chunk)} bytes (at most {CHUNK})")
                f.write(chunk)
                f.flush()
                at += len(chunk)
                self.offsets[host, name] = at

    def finish(self, run: RunDir, ports: dict[int, str]) -> dict[str, dict]:
        """The last pull; run.json's `hosts` entries: clock offset, members, what was skipped, whether
        it was read to the end (else `error`: why not). Each host's agent info is kept beside its
        captures too."""
        try:
            self.pull(run, ports, final=True)
        finally:
            read = {h: s for h, s in self.seen.items() if "offset_ns" in s and "members" in s}
            for host, seen in read.items():
                if not seen["complete"]:
                    seen.setdefault("error", "no member of it left to read it through")
                elif "truncated" in seen:
                    seen.update(complete=False, error=seen["truncated"])
                (run / "hosts" / host).mkdir(parents=True, exist_ok=True)
                write_new(run / "hosts" / host / "agent.json", json.dumps(seen).encode())
        return read

    def close(self) -> None:
        """The plugins off the cluster (a worker that joins later starts no agent), the relay ended."""
        try:
            if self.relay.poll() is None:
                self._request("close")
        except Exception:  # hung or gone: the plugins go with its client, the agents at their lease
            pass
        finally:
            if self.relay.poll() is None:
                try:
                    self.relay.wait(10)
                except subprocess.TimeoutExpired:
                    self._end_relay()


def relay_user(scheduler_pid: int | None) -> tuple[int, int] | None:
    """Whom the relay runs as: the scheduler's user if it is a process of this host not run by root,
    else the user who ran sudo, else nobody; None (ourselves) when we are not root."""
    if os.geteuid() != 0:
        return None
    try:
        st = os.stat(f"/proc/{scheduler_pid}") if scheduler_pid else None
    except OSError:
        st = None
    if st and st.st_uid != 0:
        return st.st_uid, st.st_gid
    try:
        uid, gid = int(os.environ["SUDO_UID"]), int(os.environ["SUDO_GID"])
        if uid != 0 and gid != 0:
            return uid, gid
    except (KeyError, ValueError):
        pass
    return NOBODY, NOBODY


def _start_relay(user: tuple[int, int] | None, log: Path) -> subprocess.Popen:
    env = dict(os.environ)
    kw = {}
    if user:
        uid, gid = user
        kw = {"user": uid, "group": gid, "extra_groups": []}
        try:
            home = pwd.getpwuid(uid).pw_dir
        except KeyError:
            home = "/"
        env.update(HOME=home if os.path.isdir(home) else "/")
        env.pop("SUDO_COMMAND", None)
    # its own session: a Ctrl-C at the terminal (attach's way to end) must leave it to read the agents
    # at the end. Not our_child's death signal: that fires when the thread that started it ends (the
    # agents may start in the pulls' thread); it ends when its stdin does, with us.
    relay = subprocess.Popen([sys.executable, "-m", "daskprobe.tracer.capture.agent_relay"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/", env=env, start_new_session=True,
                             **kw)
    threading.Thread(target=_drain, args=(relay.stderr, log), name="daskprobe-relay-log", daemon=True).start()
    return relay


def _drain(pipe, log: Path) -> None:
    """The relay's words into the log, up to LOG_BYTES: it is the cluster's, it may say anything."""
    kept = 0
    try:
        with open_append(log) as f:
            for chunk in iter(lambda: pipe.read1(1 << 16), b""):
                if kept < LOG_BYTES:
                    f.write(chunk[:LOG_BYTES - kept])
                    f.flush()
                    kept += len(chunk)
    except (OSError, ValueError):
        pass
