"""Root reads the files a traced process maps (the eBPF agent for GIL and libc symbols during the
run, daskprobe-unwind after it), by paths the cluster's user controls. An unprivileged user (nobody)
plants what root must not read: a FIFO, a symlink to /dev/zero, another file in place of the one
mapped, a file mapped but not readable by that user, a huge sparse "libc". Root must neither hang,
grow without bound, nor name anything from such a file; each one skipped is said with its reason."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers import probe_session
from daskprobe.experiments.unwind_cost import CHAIN_C, build_chain
from daskprobe.probes.base import capture_lines, native_binary
from daskprobe.probes.ebpf import SYSTEM_PYTHON, Ebpf
from daskprobe.probes.pyspy import read_samples
from daskprobe.probes.rundir import RunDir
from daskprobe.probes.sampler import Sampler

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("gcc"),
                                reason="needs root, setpriv and gcc")


def as_nobody(cmd: list[str]) -> list[str]:
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *cmd]


def nobodys_dir() -> Path:
    """A folder nobody owns (pytest's tmp_path is root's, 0700)."""
    home = Path(tempfile.mkdtemp(prefix="daskprobe-root-reads-"))
    os.chmod(home, 0o755)
    os.chown(home, NOBODY, NOBODY)
    return home


def started(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


# What the stacks of each pid were named after the run, and what the unwinder said; run apart, so
# that an unwinder that hangs or grows is stopped (2 GiB of address space, 120 s) rather than the test.
NAMES = """
import collections, json, sys
from pathlib import Path
from daskprobe.probes import ebpf_tables
samples, stacks, frames = ebpf_tables.read_cpu(Path(sys.argv[1]), 0, 0)
name = frames.set_index("frame_id")
ids = stacks.set_index("stack_id").frame_ids
out = collections.defaultdict(set)
for pid, stack in zip(samples.pid, samples.stack_id):
    out[int(pid)].update(f"{name.function[i]} [{name.filename[i]}]" for i in ids[stack] if name.kind[i] == "native")
print(json.dumps({pid: sorted(v) for pid, v in out.items()}))
"""


def named_after_the_run(captures: Path, tmp: Path) -> tuple[dict, str]:
    limited = tmp / "unwind-limited"
    limited.write_text(f"#!/bin/sh\nulimit -v {2 << 20}\nexec {native_binary('daskprobe-unwind')} \"$@\"\n")
    limited.chmod(0o755)
    p = subprocess.Popen([sys.executable, "-c", NAMES, str(captures / "ebpf_cpu.tsv")], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True,
                         env=dict(os.environ, DASKPROBE_UNWIND=str(limited)))
    try:
        out, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail("the unwinder did not finish in 120 s (an open that waits for a FIFO's writer?)")
    assert p.returncode == 0, err
    return {int(k): v for k, v in json.loads(out).items()}, err


def test_the_unwinder_reads_no_file_planted_after_the_run(tmp_path):
    home = nobodys_dir()
    try:
        exe = build_chain(tmp_path)
        evil_src = tmp_path / "evil.c"
        evil_src.write_text(CHAIN_C.replace("chain_", "evil_"))
        subprocess.run(["gcc", "-O2", "-fomit-frame-pointer", "-o", str(tmp_path / "evil"), str(evil_src)], check=True)
        cases = ("kept", "fifo", "zero", "replaced", "unreadable")
        for case in cases:
            (home / case).mkdir()
            shutil.copy(exe, home / case / "chain")
            if case != "unreadable":
                for p in (home / case, home / case / "chain"):
                    os.chown(p, NOBODY, NOBODY)
        os.chmod(home / "unreadable" / "chain", 0o711)  # root's: nobody may run it, not read it
        with probe_session(tmp_path, Ebpf(["cpu"], cpu_hz=199)) as s:
            procs = {case: started(as_nobody([str(home / case / "chain"), "1.0"])) for case in cases}
            for case, p in procs.items():
                s.watch(p.pid, case, "scheduler")
            for p in procs.values():
                p.stdin.write("\n")
                p.stdin.flush()
            for p in procs.values():
                p.wait(timeout=120)
        pid = {case: p.pid for case, p in procs.items()}
        # after the run, nobody changes what the recorded paths name
        for case, plant in [("fifo", "rm chain && mkfifo chain"), ("zero", "rm chain && ln -s /dev/zero chain"),
                            ("replaced", f"cat {home}/evil > chain.new && mv chain.new chain")]:
            if case == "replaced":
                shutil.copy(tmp_path / "evil", home / "evil")
                os.chmod(home / "evil", 0o755)
            subprocess.run(as_nobody(["sh", "-c", f"cd {home / case} && {plant}"]), check=True)
        names, said = named_after_the_run(s.run / "captures", tmp_path)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert "chain_leaf [chain]" in names[pid["kept"]], names[pid["kept"]]  # a file as it was: named
    for case in ("fifo", "zero", "replaced", "unreadable"):
        assert names[pid[case]], f"no samples of {case}"
        assert not [n for n in names[pid[case]] if not n.startswith("[unknown]") and n.endswith("[chain]")], \
            (case, names[pid[case]])
    for case, why in [("fifo", "not a regular file"), ("zero", "a symlink"),
                      ("replaced", "not the file the process mapped (another device or inode)"), ("unreadable", "not readable by the process's user")]:
        assert f"{home / case / 'chain'}: {why}" in said, (case, said)
    assert "4 mapped files not read" in said, said


PLANT = """
import mmap, os, sys
path = sys.argv[1]
with open(path, "wb") as f:
    f.truncate(int(sys.argv[2]))  # sparse: nothing on disk
f = open(path, "rb")
mapped = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
print("up", flush=True)
sys.stdin.readline()
"""


def high_water_mark(pid: int) -> int:
    """The process's peak resident memory, bytes."""
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM:")).split()[1]) * 1024


def test_the_ebpf_agent_reads_no_more_of_a_planted_libc_than_its_headers(tmp_path):
    home = nobodys_dir()
    big, ns = home / "big", home / "ns"
    for sub in (big, ns):
        sub.mkdir()
        os.chown(sub, NOBODY, NOBODY)
    # A 1 GiB sparse "libc.so.6" mapped before the real one, by a Python whose take_gil is found (in its
    # libpython). A "libpython3.11.so" mapped in a mount namespace of nobody's own, where a file is
    # bound over the FIFO the same path is outside it (in Debian's Python, which maps no other libpython).
    fifo = ns / "libpython3.11.so"
    os.mkfifo(fifo)
    (ns / "real").touch()
    for f in (fifo, ns / "real"):
        os.chown(f, NOBODY, NOBODY)
    bound = ["unshare", "-Urm", "sh", "-c", f'mount --bind {ns / "real"} {fifo} && exec "$0" "$@"']
    plants = [([sys.executable], big / "libc.so.6", 1 << 30), ([*bound, SYSTEM_PYTHON], fifo, 1 << 20)]
    procs = []
    try:
        with probe_session(tmp_path, Ebpf(["gil"])) as s:
            agent = s.probe.proc.pid
            assert "ebpf_agent" in Path(f"/proc/{agent}/cmdline").read_text()
            before = high_water_mark(agent)
            for python, path, size in plants:
                p = started(as_nobody([*python, "-c", PLANT, str(path), str(size)]))
                procs.append(p)
                if p.stdout.readline().strip() != "up":
                    pytest.skip("no mount namespace for nobody here (unshare -Urm)")
                first = next(line.split(maxsplit=5)[5].strip() for line in open(f"/proc/{p.pid}/maps")
                             if path.name.split(".")[0] + "." in line)
                assert first == str(path), f"{path} is not the first {path.name} mapped"
                s.watch(p.pid, path.name, "worker")
            status = s.run / "captures" / "ebpf_status.tsv"
            deadline = time.monotonic() + 60
            said = {}
            while len(said) < len(plants):
                said = {int(line.split("\t")[1]): line for line in capture_lines(status)
                        if line.startswith("E\t") and "\tgil: " in line}
                assert time.monotonic() < deadline, f"the agent said nothing of some planted files: {said}"
                time.sleep(0.1)
            grown = high_water_mark(agent) - before
    finally:
        _let_go(fifo)
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(home, ignore_errors=True)
    in_big, in_ns = (said[p.pid] for p in procs)
    assert f"no pthread_cond_timedwait in its libc ({plants[0][1]})" in in_big, in_big
    assert f"no take_gil symbol in {fifo}" in in_ns, in_ns
    assert grown < 128 << 20, f"the agent's peak memory grew by {grown >> 20} MiB"


def _let_go(fifo: Path) -> None:
    """An open waiting for the FIFO's writer (an agent stuck in it) returns."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:  # ENXIO: no reader waits
        pass


SPIN = """
import sys, time
def planted_spin(end):
    while time.monotonic() < end:
        pass
print("up", flush=True)
sys.stdin.readline()  # planted
planted_spin(time.monotonic() + 120)
"""


def test_the_sampler_reads_the_libpython_a_process_maps_not_what_its_path_names_now(tmp_path):
    """py-spy (inside daskprobe-sampler) found libpython by its path in /proc/PID/maps. A Python of
    nobody's runs its own copy of libpython, deletes it and plants, under the name maps then gives
    ("... (deleted)"), a FIFO (an open that never returns: the sampler hung, no process sampled) or
    a symlink to /dev/zero. The sampler must read the file mapped, and name the frames."""
    python = os.path.realpath(sys.executable)
    lib = Path(python).parent.parent / "lib" / "libpython3.11.so.1.0"
    if not lib.exists():
        pytest.skip(f"no {lib}: this Python has no libpython to plant over")
    probe = Sampler(["pyspy"])
    if why := probe.available():
        pytest.skip(why)
    home = nobodys_dir()
    plants = {"fifo": "mkfifo", "zero": "ln -s /dev/zero"}
    procs, fifos = {}, []
    run = RunDir(tmp_path / "run")
    for sub in ("captures", "logs"):
        (run / sub).mkdir(parents=True)
    try:
        for case in plants:
            (home / case).mkdir()
            shutil.copy(lib, home / case / lib.name)
            for p in (home / case, home / case / lib.name):
                os.chown(p, NOBODY, NOBODY)
            p = subprocess.Popen(as_nobody(["env", f"LD_PRELOAD={home / case / lib.name}", python, "-c", SPIN]),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            procs[case] = p
            assert p.stdout.readline().strip() == "up"
        for case, plant in plants.items():
            planted = f"{home / case / lib.name} (deleted)"
            subprocess.run(as_nobody(["sh", "-c", f"rm {lib.name} && {plant} '{planted}'"]), cwd=home / case,
                           check=True)
            fifos.append(Path(planted))
            assert planted in Path(f"/proc/{procs[case].pid}/maps").read_text(), "not the libpython it maps"
            procs[case].stdin.write("planted\n")
            procs[case].stdin.flush()
        probe.start(run)
        for case, p in procs.items():
            probe.watch({"pid": p.pid, "name": case, "role": "worker"})
        said, deadline = {}, time.monotonic() + 60
        while len(said) < len(procs) and time.monotonic() < deadline:
            said = {int(line.split("\t")[2]): line for line in capture_lines(run / "captures" / "pyspy.tsv")
                    if line.split("\t")[0] in ("A", "E")}
            time.sleep(0.2)
        time.sleep(1.0)  # samples of both
    finally:
        if fifos:
            _let_go(fifos[0])  # a sampler stuck in the FIFO's open returns
        probe.stop()
        for p in procs.values():
            p.kill()
            p.wait()
        shutil.rmtree(home, ignore_errors=True)
    assert len(said) == len(procs), f"the sampler said nothing of some of {sorted(procs)} in 60 s (hung?): {said}"
    samples, stacks, frames = read_samples(run / "captures" / "pyspy.tsv")
    spinning = frames.frame_id[frames.function == "planted_spin"]
    with_it = stacks.stack_id[stacks.frame_ids.map(lambda ids: bool(set(ids) & set(spinning)))]
    for case, p in procs.items():
        assert said[p.pid].startswith("A\t"), (case, said[p.pid])
        assert (samples[samples.pid == p.pid].stack_id.isin(with_it)).sum() > 0, f"{case}: planted_spin not named"
