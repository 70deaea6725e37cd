"""A bad line in the sampler's captures (pyspy.tsv, proc.tsv, threads.tsv) costs that line, never a
stage: lines of a real run's captures changed at random (seeded) as a kill, a full disk or a fault
would, one per build, and every stage still completes, with the lines left out counted in run.json
and said by `build`."""

import random
import shutil
import sys

import pytest

from daskprobe.probes.rundir import RunDir
from daskprobe.tracer.pipeline.build import finalize
from helpers import daskprobe, searchable_dir

CAPTURES = ["pyspy.tsv", "proc.tsv", "threads.tsv"]
FLOW = ("from distributed import Client\n"
        "c = Client()\n"
        "assert sum(c.gather(c.map(lambda x: x + 1, range(60)))) == 1830\n")


@pytest.fixture(scope="module")
def captured():
    out = searchable_dir("malformed") / "run"
    p = daskprobe("run", "--workers", "1", "--out", str(out), "--", sys.executable, "-c", FLOW)
    assert p.returncode == 0, p.stderr[-3000:]
    for name in CAPTURES:
        assert len((out / "captures" / name).read_bytes().split(b"\n")) > 3, name
    return out


def _changed(line: bytes, how: str, rng: random.Random) -> bytes:
    """The line as a fault could leave it."""
    b, fields = bytearray(line), line.split(b"\t")
    at = rng.randrange(len(b) + 1)
    if how == "cut":
        return bytes(b[:rng.randrange(len(b))])
    if how == "byte":
        b[min(at, len(b) - 1)] = rng.randrange(256)
    elif how == "digit":
        b[min(at, len(b) - 1)] = rng.choice(b"0123456789")
    elif how == "tab":
        b[at:at] = b"\t"
    elif how == "minus":
        b[at:at] = b"-"
    elif how == "junk":
        return rng.randbytes(rng.randrange(1, 40)).replace(b"\n", b"")
    elif how == "drop a field":
        fields.pop(rng.randrange(len(fields)))
        return b"\t".join(fields)
    elif how == "repeat a field":
        i = rng.randrange(len(fields))
        return b"\t".join(fields[:i + 1] + fields[i:])
    elif how == "overflow":  # a number no int64 holds, in the line's first numeric field
        i = 1 if fields[0].isalpha() else 0
        return b"\t".join(fields[:i] + [fields[i] + b"9" * 20] + fields[i + 1:])
    return bytes(b)


HOWS = ["cut", "byte", "digit", "tab", "minus", "junk", "drop a field", "repeat a field", "overflow"]


def _mutated(captured, dest, rng: random.Random) -> tuple[str, str]:
    """A copy of the run with one line of one capture changed: (the capture, how)."""
    dest.mkdir()
    for sub in ("captures", "logs"):
        shutil.copytree(captured / sub, dest / sub)
    shutil.copy(captured / "run.json", dest / "run.json")
    (dest / "tables").mkdir()
    name, how = rng.choice(CAPTURES), rng.choice(HOWS)
    path = dest / "captures" / name
    lines = path.read_bytes().split(b"\n")
    # the last line is what follows the last newline (empty, or torn): change a whole one; in
    # pyspy.tsv one of the lines it reads (frames and stacks)
    k = rng.choice([i for i, line in enumerate(lines[:-1]) if name != "pyspy.tsv" or line[:2] in (b"F\t", b"S\t")])
    lines[k] = _changed(lines[k], how, rng)
    path.write_bytes(b"\n".join(lines))
    return name, how


@pytest.mark.timeout(1500)  # 24 builds: about 2 s each here, 12 s or more beside two busy loops
def test_a_bad_line_costs_the_line_never_a_stage(captured, tmp_path):
    rng, outcomes = random.Random(37), []
    for i in range(24):
        dest = tmp_path / f"m{i}"
        name, how = _mutated(captured, dest, rng)
        finalize(RunDir(dest))
        meta = RunDir(dest).meta()
        counted = meta["capture"]["malformed_lines"].get(f"captures/{name}", 0)
        outcomes.append((name, how, meta["finalize_errors"], counted))
        assert meta["finalize_errors"] == {} and meta["finalized"] is True, outcomes[-1]
        assert RunDir(dest).has_table("samples") and (dest / "report.html").exists() and (dest / "trace.pftrace").exists()
        if how == "overflow":
            assert counted >= 1, outcomes[-1]  # 2 where the line defined a frame a stack names
        assert set(meta["capture"]["malformed_lines"]) <= {f"captures/{name}"}, outcomes[-1]
    assert sum(n for *_, n in outcomes) >= 5, outcomes


def test_build_says_how_many_lines_it_left_out(captured, tmp_path):
    dest = tmp_path / "m"
    dest.mkdir()
    for sub in ("captures", "logs"):
        shutil.copytree(captured / sub, dest / sub)
    shutil.copy(captured / "run.json", dest / "run.json")
    with open(dest / "captures" / "proc.tsv", "ab") as f:
        f.write(b"not\ta\tline\n" * 3)
    p = daskprobe("build", "--no-trace", str(dest))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "malformed lines (torn or corrupted) left out of the captures: 3 of captures/proc.tsv" in p.stderr, p.stderr
    assert RunDir(dest).meta()["capture"]["malformed_lines"] == {"captures/proc.tsv": 3}
