"""What no peer, signal, full disk or odd input may do: cost a user their run,
their data or their machine. Real clusters, real signals, a real full disk."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from helpers import daskprobe, run_flow, write_flow
from daskprobe.probes.rundir import RunDir

SLEEPER = """
import os, time
from distributed import Client
with Client() as c:
    assert c.submit(sum, [1, 2]).result() == 3
    open({marker!r}, "w").close()
    while not os.path.exists({go!r}):
        time.sleep(0.05)
"""


def descendants(pid: int) -> set[int]:
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def alive(pids) -> set[int]:
    out = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.add(pid)
    return out


def wait_for(cond, timeout=120, what="condition"):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def ours_in_a_traceback(err: str) -> bool:
    """A traceback through daskprobe's own code (the user's command may print its own)."""
    root = Path(__file__).resolve().parents[1]
    ours = [str(root / layer) for layer in ("probes", "analyzers", "dashboards", "tracer", "experiments")]
    return any(line.strip().startswith("File ") and any(o in line for o in ours) for line in err.splitlines())


STARTED: list[subprocess.Popen] = []
SHARED: list[Path] = []


@pytest.fixture(autouse=True)
def _no_run_outlives_its_test():
    """A test that fails before its run ends would leave it waiting for `go`: its daskprobe is
    killed (its helpers and cluster die with it)."""
    yield
    while STARTED:
        p = STARTED.pop()
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    while SHARED:
        shutil.rmtree(SHARED.pop(), ignore_errors=True)


def shared_dir() -> Path:
    """A directory the cluster's user may write to (a root run's command runs as another user): for
    the markers a flow and its test exchange. Sticky, as a run directory's parents must be."""
    d = Path(tempfile.mkdtemp(prefix="daskprobe-test-"))
    d.chmod(0o1777)
    SHARED.append(d)
    return d


def start(tmp_path, *opts, flow_code=None):
    shared = shared_dir()
    marker, go = shared / "started", shared / "go"
    flow = write_flow(tmp_path / "flow.py", flow_code or SLEEPER.format(marker=str(marker), go=str(go)))
    out = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "daskprobe.tracer.commands", "run", "--out", str(out), *opts, "--",
                          sys.executable, str(flow)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    STARTED.append(p)
    return p, RunDir(out), marker, go


def listening_sockets(pids: set[int]) -> list[tuple[int, str]]:
    """(pid, local address) of every listening TCP socket the processes hold."""
    inodes = {}
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes[link[8:-1]] = pid
    out = []
    for table, size in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:
                out.append((inodes[cols[9]], _address(cols[1], size)))
    return out


def _address(hex_addr: str, size: int) -> str:
    ip, port = hex_addr.split(":")
    raw = bytes.fromhex(ip)
    if size == 8:
        return f"{socket.inet_ntop(socket.AF_INET, raw[::-1])}:{int(port, 16)}"
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return f"[{socket.inet_ntop(socket.AF_INET6, words)}]:{int(port, 16)}"


def test_nothing_a_run_starts_listens_off_loopback(tmp_path):
    p, run, marker, go = start(tmp_path, "--workers", "2", "--nanny")
    try:
        wait_for(marker.exists, what="the flow to start")
        pids = descendants(p.pid) | {p.pid}
        sockets = listening_sockets(pids)
    finally:
        go.touch()
        p.communicate(timeout=120)
    assert len(sockets) >= 6, sockets  # proxy routes, scheduler, workers, nannies, their HTTP servers
    off = [(pid, a) for pid, a in sockets if not (a.startswith("127.0.0.1:") or a.startswith("[::1]:"))]
    assert not off, off


def test_an_out_directory_others_control_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534) if os.geteuid() == 0 else theirs.chmod(0o777)
    p = daskprobe("run", "--out", str(theirs), "--", sys.executable, "-c", "pass")
    assert p.returncode != 0 and "another user or is writable by others" in p.stderr
    assert "Traceback" not in p.stderr and not any(theirs.iterdir())


def test_a_run_under_a_directory_others_control_is_refused(tmp_path):
    # they could swap the run directory for a symlink once daskprobe has made it
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534) if os.geteuid() == 0 else theirs.chmod(0o777)
    p = daskprobe("run", "--out", str(theirs / "a" / "run"), "--", sys.executable, "-c", "pass")
    assert p.returncode != 0 and "could be swapped for a symlink" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def test_no_file_of_a_run_is_written_through_a_planted_symlink(tmp_path):
    from daskprobe.probes.rundir import open_append, open_new
    victim = tmp_path / "victim"
    victim.write_text("precious")
    for name, opener in (("log", open_append), ("table", open_new)):
        (tmp_path / name).symlink_to(victim)
        try:
            opener(tmp_path / name).close()
        except OSError:
            pass  # refused (ELOOP)
    (tmp_path / "proxy.bin").symlink_to(victim)
    from daskprobe.probes.base import native_binary
    p = subprocess.run([native_binary("daskprobe-proxy"), "--capture", str(tmp_path / "proxy.bin"),
                        "--route", "127.0.0.1:0,127.0.0.1:9,x"], capture_output=True, text=True, timeout=10)
    assert p.returncode != 0 and "cannot open capture file" in p.stderr, p.stderr
    assert victim.read_text() == "precious"


def test_run_json_is_not_written_through_a_planted_symlink(tmp_path):
    run = RunDir.create(str(tmp_path / "run"), ["x"])
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (run / "run.json.tmp").symlink_to(victim)
    run.update_meta(partial=True)
    assert victim.read_text() == "precious" and run.meta() == {"partial": True}


def test_dask_scratch_space_is_private_to_the_run(tmp_path):
    code = "from distributed import Client\nwith Client() as c:\n    assert c.submit(sum, [1, 2]).result() == 3\n"
    run, _ = run_flow(tmp_path, code, "--workers", "1", "--nanny")
    said = next(line for line in (run / "logs" / "worker-0.log").read_text().splitlines() if "Local Directory:" in line)
    local = Path(said.split("Local Directory:")[1].strip())
    if os.geteuid() == 0:  # the cluster runs as another user: a directory of its own, private, removed at the end
        assert local.parent.parent.name.startswith("daskprobe-scratch-") and not local.parent.parent.exists(), said
    else:
        scratch = run / "scratch"
        assert scratch.stat().st_mode & 0o777 == 0o700 and local.is_relative_to(scratch), said
        assert any(scratch.rglob("nanny_contact.py")), "the nanny copied its preload into the run's scratch"


MALFORMED = """
import socket, struct
from distributed import Client

def send_raw(frame0):
    host, port = __import__("os").environ["DASK_SCHEDULER_ADDRESS"][6:].rsplit(":", 1)
    with socket.create_connection((host, int(port))) as s:
        s.sendall(struct.pack("<QQQ", 16 + len(frame0), 1, len(frame0)) + frame0)

send_raw(b"\\x81\\x81\\x01\\x02\\x03")  # a map as a map key
send_raw(b"\\x91" * 100000 + b"\\x00")  # nesting no decoder will follow
with Client() as c:
    assert sum(c.gather(c.map(lambda x: x + 1, range(20)))) == 210
"""


def test_malformed_messages_are_rows_and_every_stage_still_runs(tmp_path):
    run, p = run_flow(tmp_path, MALFORMED, "--workers", "1")
    m = run.table("messages")
    bad = m[m.op == "undecodable"]
    assert len(bad) == 2 and bad.error.notna().all()
    assert (m.op == "compute-task").sum() == 20
    meta = run.meta()
    assert meta["finalize_errors"] == {} and meta["finalized"] is True
    assert (run / "summary.json").exists() and (run / "report.html").exists() and run.trace.stat().st_size
    assert "2 messages could not be decoded" in p.stderr


def _cmdline(pid: int) -> str:
    """Its command line; empty once it is gone (it may end between being listed and being read)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    except OSError:
        return ""


def test_a_signal_during_probe_startup_stops_everything(tmp_path):
    from daskprobe.probes.ebpf import environment_problem
    if why := environment_problem():
        pytest.skip(why)  # without eBPF, start-up is too quick to hit
    p, run, marker, go = start(tmp_path, "--workers", "1")
    seen = set()

    def agent_started():
        seen.update(descendants(p.pid))
        return any("ebpf_agent" in _cmdline(pid) for pid in alive(seen))
    wait_for(agent_started, 60, "the eBPF agent")
    os.killpg(p.pid, signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGINT, err
    deadline = time.monotonic() + 15  # they are told to stop, and die: the kernel may take a moment
    while alive(seen):
        assert time.monotonic() < deadline, f"orphans: {[(q, _cmdline(q)) for q in alive(seen)]}"
        time.sleep(0.1)
    assert run.meta()["exit_code"] == 128 + signal.SIGINT and not marker.exists()


def test_a_signal_before_the_cluster_starts_is_recorded(tmp_path):
    # early on (while the probes start or daskprobe asks the cluster's interpreter for its versions)
    p, run, marker, go = start(tmp_path, "--workers", "1")
    wait_for(lambda: (run / "run.json").exists(), what="the run directory")
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM and not ours_in_a_traceback(err), err
    meta = run.meta()
    assert meta["exit_code"] == 128 + signal.SIGTERM and meta["partial"] is False and "ended" in meta


def test_a_second_ctrl_c_hurries_the_teardown_and_still_records_the_run(tmp_path):
    p, run, marker, go = start(tmp_path, "--workers", "1")
    wait_for(marker.exists, what="the flow to start")
    seen = descendants(p.pid)
    os.killpg(p.pid, signal.SIGINT)
    time.sleep(0.3)
    os.killpg(p.pid, signal.SIGINT)
    _, err = p.communicate(timeout=90)
    assert p.returncode == 128 + signal.SIGINT and not ours_in_a_traceback(err), err
    deadline = time.monotonic() + 15  # they are told to stop, and die: the kernel may take a moment
    while alive(seen):
        assert time.monotonic() < deadline, f"orphans: {[(q, _cmdline(q)) for q in alive(seen)]}"
        time.sleep(0.1)
    meta = run.meta()
    assert meta["exit_code"] == 128 + signal.SIGINT and "ended" in meta


def test_sigterm_while_finalizing_says_how_to_finish_and_leaves_no_orphan(tmp_path):
    quick = "from distributed import Client\nwith Client() as c:\n    c.gather(c.map(lambda x: x, range(200)))\n"
    p, run, _, _ = start(tmp_path, "--workers", "1", flow_code=quick)
    seen = set()

    def finalizing():
        seen.update(descendants(p.pid))
        return (run / "run.json").exists() and "ended" in run.meta()
    wait_for(finalizing, what="the run to end")
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    meta = run.meta()
    if meta.get("finalized"):
        pytest.skip("finalize ended before the signal came")
    assert p.returncode == 128 + signal.SIGTERM, err
    assert "interrupted" in json.dumps(meta["finalize_errors"]) and f"daskprobe build {run.path}" in err
    deadline = time.monotonic() + 15  # they are told to stop, and die: the kernel may take a moment
    while alive(seen):
        assert time.monotonic() < deadline, f"orphans: {[(q, _cmdline(q)) for q in alive(seen)]}"
        time.sleep(0.1)
    assert daskprobe("build", str(run.path)).returncode == 0 and run.meta()["finalized"] is True


def small_disk(tmp_path: Path) -> Path:
    """A 20 MB tmpfs at tmp_path/disk (unmounted by the caller), or the test skipped."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("needs root to mount a small tmpfs")
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(disk)]).returncode:
        pytest.skip("cannot mount tmpfs here")
    return disk


@pytest.mark.parametrize("messages", ["proxy", "tap"])
def test_a_full_disk_keeps_the_users_exit_code_and_what_was_written(tmp_path, messages):
    disk = small_disk(tmp_path)
    try:
        filler = disk / "filler"
        fill = f"""
import time
from distributed import Client
with Client() as c:
    c.gather(c.map(lambda x: x + 1, range(50)))
    time.sleep(1)  # what was captured by now has been written (captures flush every 50-200 ms)
    # something else fills the disk while the run goes on; unbuffered, or closing the file would
    # flush what the full disk refused and fail the command itself
    with open({str(filler)!r}, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"x" * 65536)
        except OSError:
            pass
    c.gather(c.map(lambda x: x + 2, range(50)))
"""
        flow = write_flow(tmp_path / "fill.py", fill)
        probes = ["--probes", "all" if messages == "proxy" else "tap,pyspy,proc"]
        p = daskprobe("run", "--workers", "1", *probes, "--out", str(disk / "run"), "--", sys.executable, str(flow),
                      timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]  # the user's command exited 0
        assert not ours_in_a_traceback(p.stderr.split("stage failed")[0])
        assert f"filesystem at {disk}" in p.stderr, p.stderr[-3000:]
        if messages == "tap":  # the sampler writes stacks and /proc readings every 200 ms: it says it stopped
            assert "probe pyspy,proc stopped early: writing" in p.stderr, p.stderr[-3000:]
        run = RunDir(disk / "run")
        assert json.loads((run / "run.json").read_text())["partial"] is True  # a whole file, and says so
        filler.unlink()
        b = daskprobe("build", str(run.path))
        failed = [line for line in b.stderr.splitlines() if "stage failed" in line]  # each cause, not only the last
        assert b.returncode == 0, "\n".join(failed) + "\n" + b.stderr[-2000:]
        assert (run.table("messages").op == "compute-task").sum() >= 50
    finally:
        subprocess.run(["umount", "-l", str(disk)])


def test_a_capture_stopped_by_a_full_disk_is_said_and_its_cut_job_is_incomplete(tmp_path):
    disk = small_disk(tmp_path)
    try:
        filler = disk / "filler"
        fill = f"""
import time
from distributed import Client, wait
def slow(x):
    time.sleep(0.1)
    return x
with Client() as c:
    futures = c.map(slow, range(40))
    time.sleep(1)  # some results told, and written
    with open({str(filler)!r}, "wb", buffering=0) as f:  # something else fills the disk meanwhile
        try:
            while True:
                f.write(b"x" * 65536)
        except OSError:
            pass
    wait(futures)
"""
        flow = write_flow(tmp_path / "fill.py", fill)
        p = daskprobe("run", "--workers", "1", "--threads", "1", "--probes", "proxy,proc", "--out", str(disk / "run"),
                      "--", sys.executable, str(flow), timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        assert "probe proxy stopped early: capture stopped at" in p.stderr, p.stderr[-3000:]  # said at the end
        filler.unlink()
        run = RunDir(disk / "run")
        b = daskprobe("build", str(run.path))
        assert b.returncode == 0, b.stderr[-3000:]
        stopped = run.meta()["lost"]["proxy"]["stopped"]
        assert "No space left" in stopped["reason"] and stopped["at_bytes"] == run.proxy_capture.stat().st_size
        jobs = run.table("jobs")
        assert len(jobs) == 1 and not jobs.complete[0] and 0 < jobs.untold[0] < 40, jobs
        caveats = json.loads((run / "summary.json").read_text())["caveats"]
        said = b.stderr + (run / "report.html").read_text()
        for words in ("the proxy's capture stopped", "1 of 1 job(s) have no recorded end"):
            assert any(words in c for c in caveats), caveats
            assert words in said.replace("&#x27;", "'"), words
    finally:
        subprocess.run(["umount", "-l", str(disk)])


def test_a_build_of_a_run_still_recording_says_so(tmp_path):
    p, run, marker, go = start(tmp_path, "--workers", "1", "--probes", "proxy")
    try:
        wait_for(marker.exists, what="the flow to start")
        b = daskprobe("build", "--no-trace", str(run.path))
        said = " ".join(b.stderr.split())
        assert "warning: the run is still recording" in said, b.stderr[-3000:]
        assert "caution: built while the run was still recording" in said, b.stderr[-3000:]
    finally:
        go.touch()
        _, err = p.communicate(timeout=180)
    assert p.returncode == 0, err[-3000:]
    assert "still recording" not in err  # its own finalizing is not a build of a live run


def test_a_user_without_root_runs_with_what_it_can(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("run as root: the test switches to nobody")
    home = Path(tempfile.mkdtemp(prefix="daskprobe-nobody-"))  # pytest's own tmp is root's, private
    os.chown(home, 65534, 65534)
    check = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", "1"])
    if check.returncode:
        pytest.skip("this checkout's interpreter is not readable by other users")
    code = "from distributed import Client\nc = Client()\nassert c.submit(sum, [1, 2]).result() == 3\n"
    flow = write_flow(home / "flow.py", code)
    p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "env", f"HOME={home}",
                        sys.executable, "-m", "daskprobe.tracer.commands", "run", "--workers", "1", "--out",
                        str(home / "run"), "--", sys.executable, str(flow)], capture_output=True, text=True,
                       timeout=240, cwd=home)
    assert p.returncode == 0, p.stderr[-3000:]
    run = RunDir(home / "run")
    meta = run.meta()
    assert meta["skipped"].get("gil") == "eBPF needs root" and "pyspy" not in meta["skipped"]
    assert len(run.table("samples")) > 0 and meta["finalized"] is True
    shutil.rmtree(home)


def test_open_serves_past_a_silent_peer_and_only_to_its_own_host(pinned_run):
    run, _, _ = pinned_run
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "daskprobe.tracer.commands", "open", "--port", str(port), str(run.path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        server.stdout.readline()
        silent = socket.create_connection(("127.0.0.1", port))  # connects, says nothing
        url = f"http://127.0.0.1:{port}/trace.pftrace"
        with urllib.request.urlopen(url, timeout=5) as r:
            assert r.read() == run.trace.read_bytes()
        rebound = urllib.request.Request(url, headers={"Host": f"evil.example:{port}"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(rebound, timeout=5)
        assert e.value.code == 403
        silent.close()
    finally:
        server.terminate()
        server.wait(10)


@pytest.mark.parametrize("option", [["--delay-ms", "-1"], ["--delay-ms", "inf"], ["--sample-rate", "0"],
                                    ["--sample-rate", "nan"], ["--cpu-hz", "0"], ["--workers", "0"],
                                    ["--threads", "-1"]])
def test_bad_options_are_refused_with_a_message(option):
    p = daskprobe("run", *option, "--", sys.executable, "-c", "pass")
    assert p.returncode == 2 and option[0] in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("kind", ["not empty", "a file", "read-only"])
def test_an_unusable_out_is_refused_with_a_message(tmp_path, kind):
    out = tmp_path / "out"
    if kind == "not empty":
        out.mkdir()
        (out / "mine").write_text("keep")
    elif kind == "a file":
        out.write_text("keep")
    else:
        if os.geteuid() != 0:
            pytest.skip("mounting a read-only filesystem needs root")
        (tmp_path / "ro").mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(tmp_path / "ro")], check=True)
        out = tmp_path / "ro" / "run"
    try:
        p = daskprobe("run", "--out", str(out), "--", sys.executable, "-c", "pass")
    finally:
        if kind == "read-only":
            subprocess.run(["umount", "-l", str(tmp_path / "ro")])
    assert p.returncode != 0 and "--out" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert kind == "read-only" or "keep" in ((out / "mine") if kind == "not empty" else out).read_text()


@pytest.mark.parametrize("victim", ["probe:pyspy,proc", "proxy"])
def test_a_helper_killed_mid_run_makes_the_run_partial_and_says_so(tmp_path, victim):
    p, run, marker, go = start(tmp_path, "--workers", "1", "--probes", "proxy,pyspy,proc")
    wait_for(marker.exists, what="the flow to start")
    pid = next(r["pid"] for r in run.meta()["processes"] if r["name"] == victim)
    os.kill(pid, signal.SIGKILL)
    go.touch()
    _, err = p.communicate(timeout=180)
    assert not ours_in_a_traceback(err), err
    name = victim.removeprefix("probe:")
    assert f"probe {name} stopped early: its process ended during the run (killed by SIGKILL)" in err, err
    meta = run.meta()
    assert meta["partial"] is True and "SIGKILL" in meta["probe_errors"][name] and meta["finalized"] is True
    caution = f"caution: the run is partial: {name} stopped early"  # at the end, and in the report
    assert caution in " ".join(err.split()) and caution[9:] in (run / "report.html").read_text()
    assert len(run.table("messages")) > 0 and len(run.table("samples")) > 0, "what was captured before is kept"
