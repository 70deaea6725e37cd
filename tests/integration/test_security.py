"""A root `daskprobe run` hands no local user root: the cluster and the command run unprivileged, and
the cluster serves only its own members and the command. The attacker is another local user, who
finds the cluster's ports and tries to reach every one of them."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from daskprobe.probes.sockets import LISTEN, split_address, tcp_sockets
from helpers import NO_UCX, UCX_PYTHON, write_flow

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")

ATTACKER = 54321  # a uid no process of the run has

# The command: a client that computes, says it is ready, and stays connected until told to go.
COMMAND = """
import os, sys, time
from distributed import Client
with Client() as c:
    assert c.submit(sum, [1, 2]).result() == 3
    open(sys.argv[1] + "/ready", "w").write(str(os.getuid()))
    deadline = time.time() + 120
    while not os.path.exists(sys.argv[1] + "/go") and time.time() < deadline:
        time.sleep(0.05)
"""

# The attacker: for each address, a Dask RPC (any answer means it reached a server that runs code
# for whoever connects), and through a scheduler a Client's run_on_scheduler(os.system).
ATTACK = """
import os, sys
from distributed import Client
from distributed.core import rpc
from distributed.utils import sync
from tornado.ioloop import IOLoop
mark, reached = sys.argv[1], []
async def ask(addr):
    async with rpc(addr, timeout=3) as r:
        return await r.identity()
for addr in sys.argv[2:]:
    try:
        IOLoop.current().run_sync(lambda: ask(addr), timeout=6)
        reached.append(addr)
    except Exception:
        pass
    try:
        with Client(addr, timeout=4) as c:
            c.run_on_scheduler(os.system, "touch " + mark)
    except Exception:
        pass
print("REACHED", " ".join(reached))
"""


def _uid(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])


def _wait_for(path: Path, proc: subprocess.Popen, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


@pytest.mark.parametrize("sudo,protocol", [(None, "tcp"), (65534, "tcp"), (None, "ws")],
                         ids=["root", "sudo-nobody", "ws"])
def test_no_local_user_reaches_the_cluster_of_a_root_run(sudo, protocol):
    """Root with no sudo runs the cluster as the system user 'daskprobe'; through sudo, as the invoking
    user (here nobody). Either way the attacker reaches none of the cluster's addresses, direct or
    through the proxy, and nothing runs as root; the run directory ends private to the invoking user.
    On ws:// (websockets: Tornado's HTTP server, no proxy) too, and its listeners are on loopback only
    (distributed's own would listen on every interface)."""
    home = Path(tempfile.mkdtemp(prefix="daskprobe-sec-"))
    try:
        home.chmod(0o777)  # the command's user writes its ready file here; the attacker reads its script
        flow, attack = write_flow(home / "flow.py", COMMAND), write_flow(home / "attack.py", ATTACK)
        # the run directory where only root may go: the cluster's user needs nothing of it
        mark, out = home / "pwned", Path(tempfile.mkdtemp(prefix="daskprobe-sec-out-")) / "run"
        env = dict(os.environ, SUDO_UID=str(sudo), SUDO_GID=str(sudo), SUDO_USER="nobody") if sudo else \
            {k: v for k, v in os.environ.items() if not k.startswith("SUDO_")}
        run = subprocess.Popen([sys.executable, "-m", "daskprobe.tracer.commands", "run", "--workers", "1", "--no-trace",
                                "--probes", "proxy,proc", "--protocol", protocol, "--out", str(out), "--",
                                sys.executable, str(flow), str(home)],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _wait_for(home / "ready", run)
            meta = json.loads((out / "run.json").read_text())
            members = [p for p in meta["processes"] if p["role"] in ("scheduler", "worker")]
            addresses = sorted({f"{protocol}://{p[k]}" for p in members for k in ("listen", "contact")})
            bound = {s.local for s in tcp_sockets() if s.state == LISTEN and int(s.local.rpartition(":")[2])
                     in {split_address(a)[1] for a in addresses}}
            command_uid = int((home / "ready").read_text())
            member_uids = {_uid(p["pid"]) for p in members}
            attack_run = subprocess.run(["setpriv", f"--reuid={ATTACKER}", f"--regid={ATTACKER}", "--clear-groups",
                                         sys.executable, str(attack), str(mark), *addresses],
                                        capture_output=True, text=True, timeout=120, cwd=home)
        finally:
            (home / "go").touch()
            stdout, stderr = run.communicate(timeout=240)
        assert run.returncode == 0, stderr[-3000:]
        expected = sudo if sudo else pwd.getpwnam("daskprobe").pw_uid
        assert command_uid == expected and member_uids == {expected}, (command_uid, member_uids)
        # scheduler and worker, each listening behind its proxy (ws: no proxy), on loopback alone
        assert len(addresses) == (4 if protocol == "tcp" else 2) and len(bound) == len(addresses), (addresses, bound)
        assert all(b.startswith("127.0.0.1:") for b in bound), bound
        reached = next(line for line in attack_run.stdout.splitlines() if line.startswith("REACHED")).split()[1:]
        assert reached == [] and not mark.exists(), attack_run.stdout + attack_run.stderr[-2000:]
        st = out.stat()
        assert (st.st_uid, st.st_mode & 0o777) == ((sudo, 0o700) if sudo else (0, 0o700))
        private = [p for p in out.rglob("*") if not p.is_symlink() and p.stat().st_mode & 0o077]
        assert not private, private[:5]
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.skipif(not UCX_PYTHON, reason=NO_UCX)
def test_a_ucx_cluster_and_its_command_are_in_a_network_of_their_own():
    """UCX's listener binds every interface and a UCX endpoint carries nothing the peer guard could check: the
    cluster and the command run in a network namespace of their own, with loopback alone. No listener of
    theirs is in ours, where every other user is."""
    python = UCX_PYTHON
    home = Path(tempfile.mkdtemp(prefix="daskprobe-sec-ucx-"))
    try:
        home.chmod(0o777)
        flow, out = write_flow(home / "flow.py", COMMAND), Path(tempfile.mkdtemp(prefix="daskprobe-sec-out-")) / "run"
        run = subprocess.Popen([sys.executable, "-m", "daskprobe.tracer.commands", "run", "--workers", "1", "--no-trace",
                                "--probes", "proc", "--protocol", "ucx", "--python", python, "--out", str(out), "--",
                                python, str(flow), str(home)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _wait_for(home / "ready", run)
            meta = json.loads((out / "run.json").read_text())
            members = [p for p in meta["processes"] if p["role"] in ("scheduler", "worker")]
            ours = os.stat("/proc/self/ns/net").st_ino
            theirs = {os.stat(f"/proc/{p['pid']}/ns/net").st_ino for p in members}
            interfaces = {line.split(":")[0].strip() for line in
                          Path(f"/proc/{members[0]['pid']}/net/dev").read_text().splitlines()[2:]}
            ports = {split_address(p["listen"])[1] for p in members}
            here = {s.local for s in tcp_sockets() if s.state == LISTEN and int(s.local.rpartition(":")[2]) in ports}
        finally:
            (home / "go").touch()
            stdout, stderr = run.communicate(timeout=240)
        assert run.returncode == 0, stderr[-3000:]
        assert len(theirs) == 1 and ours not in theirs
        assert interfaces == {"lo"}, interfaces
        assert not here, here
        assert meta["scheduler_address"].startswith("ucx://")
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_a_command_the_clusters_user_cannot_read_is_refused_before_anything_starts(tmp_path):
    """Root's own files stay root's: the run says who cannot read what, and starts nothing."""
    hidden = Path(tempfile.mkdtemp(prefix="daskprobe-hidden-"))  # 0700, root's
    try:
        flow = write_flow(hidden / "flow.py", "print('ran')")
        out = tmp_path / "run"
        p = subprocess.run([sys.executable, "-m", "daskprobe.tracer.commands", "run", "--out", str(out), "--",
                            sys.executable, str(flow)], capture_output=True, text=True, timeout=60,
                           env={k: v for k, v in os.environ.items() if not k.startswith("SUDO_")})
        assert p.returncode != 0 and "ran" not in p.stdout
        assert str(flow) in p.stderr and "--user" in p.stderr, p.stderr
        assert not out.exists()
    finally:
        shutil.rmtree(hidden, ignore_errors=True)


def test_root_rebuilding_another_users_run_writes_nothing_through_the_links_they_planted(pinned_run, tmp_path):
    """`daskprobe build` as root on a run directory its owner made a trap of (tables/ a link to a
    directory of root's) works as that owner: nothing lands in root's directory."""
    run, _, _ = pinned_run
    copy, victim = tmp_path / "theirs", tmp_path / "roots"
    shutil.copytree(run.path, copy, symlinks=True)
    victim.mkdir(mode=0o755)
    shutil.rmtree(copy / "tables")
    (copy / "tables").symlink_to(victim)
    for p in [copy, *copy.rglob("*")]:
        os.lchown(p, 65534, 65534)
    p = subprocess.run([sys.executable, "-m", "daskprobe.tracer.commands", "build", "--no-trace", str(copy)],
                       capture_output=True, text=True, timeout=300)
    assert list(victim.iterdir()) == [], p.stderr[-2000:]
    assert "working as nobody" in p.stderr


STANDING = """
import json, sys
from distributed import LocalCluster
if __name__ == "__main__":
    with LocalCluster(n_workers=1, threads_per_worker=1, host="127.0.0.1", dashboard_address=None) as cluster:
        print(json.dumps({"address": cluster.scheduler_address}), flush=True)
        sys.stdin.readline()
"""


def test_attachs_command_runs_unprivileged(tmp_path):
    """A client unpickles what the cluster sends: attach runs its command as the user who ran sudo, or
    the system user 'daskprobe', never as root."""
    flow = write_flow(tmp_path / "flow.py", "import os\nfrom distributed import Client\n"
                      "with Client() as c:\n    print('uid', os.getuid(), c.submit(sum, [1, 2]).result())\n")
    standing = subprocess.Popen([sys.executable, "-c", STANDING], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, cwd=tmp_path)
    try:
        address = json.loads(standing.stdout.readline())["address"]
        p = subprocess.run([sys.executable, "-m", "daskprobe.tracer.commands", "attach", address, "--no-trace", "--probes",
                            "proc", "--out", str(tmp_path / "run"), "--", sys.executable, str(flow)],
                           capture_output=True, text=True, timeout=300,
                           env={k: v for k, v in os.environ.items() if not k.startswith("SUDO_")})
    finally:
        standing.communicate("\n", timeout=60)
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"uid {pwd.getpwnam('daskprobe').pw_uid} 3" in p.stdout, p.stdout + p.stderr[-2000:]
    assert (tmp_path / "run").stat().st_mode & 0o077 == 0
