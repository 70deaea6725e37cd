"""Every numeric option of run, attach and bench is checked where it is parsed: a number out of its
range, not finite or not a number ends the command with argparse's error (exit 2, the option named),
never a traceback later or a sampler that starves the machine."""

import pytest

from daskprobe.tracer.commands import parser

# verb, option, the first value out of range below, the bounds (both accepted), the first above
BOUNDS = [
    ("run", "--workers", "0", "1", "1024", "1025"),
    ("run", "--workers-per-process", "0", "1", "1024", "1025"),
    ("run", "--threads", "0", "1", "256", "257"),
    ("run", "--sample-rate", "0.5", "1", "1000", "1000.5"),
    ("run", "--cpu-hz", "0", "1", "1000", "1001"),
    ("run", "--delay-ms", "-0.001", "0", "60000", "60000.5"),
    ("run", "--start-timeout", "0", "0.1", "3600", "3601"),
    ("attach", "--sample-rate", "0.9", "1", "1000", "1e9"),
    ("attach", "--cpu-hz", "0", "1", "1000", "1001"),
    ("attach", "--duration", "0", "0.5", "604800", "604801"),
    ("bench", "--workers", "0", "1", "1024", "1025"),
    ("bench", "--workers-per-process", "0", "1", "1024", "1025"),
    ("bench", "--threads", "0", "1", "256", "257"),
    ("bench", "--repeat", "0", "1", "1000", "1001"),
    ("bench", "--timeout", "0", "1", "604800", "604801"),
]
LEADING = {"run": [], "attach": ["tcp://127.0.0.1:1"], "bench": ["--graphs", "merge-10"]}


def parse(verb: str, option: str, value: str):
    p, _ = parser()
    return p.parse_args([verb, *LEADING[verb], f"{option}={value}"])


def refused(verb: str, option: str, value: str, capsys) -> str:
    with pytest.raises(SystemExit) as exit:
        parse(verb, option, value)
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}:" in err and "Traceback" not in err
    return err


@pytest.mark.parametrize("verb,option,below,low,high,above", BOUNDS)
def test_each_bound_is_kept(verb, option, below, low, high, above, capsys):
    dest = option.lstrip("-").replace("-", "_")
    for ok in (low, high):
        got = getattr(parse(verb, option, ok), dest)
        assert (got == [float(ok)]) if verb == "bench" and option == "--workers" else got == float(ok)
    for bad in (below, above):
        assert "out of range" in refused(verb, option, bad, capsys)


@pytest.mark.parametrize("verb,option", [(v, o) for v, o, *_ in BOUNDS])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e300", "ten", ""])
def test_no_infinite_unreadable_or_huge_number(verb, option, value, capsys):
    refused(verb, option, value, capsys)


def test_the_reported_cases(capsys):
    """From the issue: a traceback, and a sampler asked for a billion samples a second."""
    assert "out of range: from 0 to 60000" in refused("run", "--delay-ms", "1e300", capsys)
    assert "out of range: from 1 to 1000" in refused("run", "--sample-rate", "1e9", capsys)


def test_bench_workers_are_each_checked_and_read_as_integers(capsys):
    assert parse("bench", "--workers", "1,2,4").workers == [1, 2, 4]
    assert "not an integer" in refused("bench", "--workers", "2,x", capsys)
    assert "out of range" in refused("bench", "--workers", "2,1025", capsys)


def test_runs_default_sample_rate_is_lower_where_py_spy_reads_the_cluster(monkeypatch):
    """py-spy's reader (an interpreter ours does not know, or --native) costs 4-5 times the CPU per
    sample: run's default rate drops to PYSPY_SAMPLE_RATE there, and says so; nowhere else."""
    import sys
    from daskprobe.probes import rates
    from daskprobe.tracer.capture import cluster
    from daskprobe.tracer.commands.run_verb import _default_rate
    said = []
    assert _default_rate(["pyspy"], False, sys.executable, None, said.append) == rates.SAMPLE_RATE and not said
    assert _default_rate(["proc"], True, sys.executable, None, said.append) == rates.SAMPLE_RATE and not said
    assert _default_rate(["pyspy"], True, sys.executable, None, said.append) == rates.PYSPY_SAMPLE_RATE
    assert "--native" in said.pop()
    for version, rate in (("3.9.18", rates.PYSPY_SAMPLE_RATE), ("3.14.0", rates.PYSPY_SAMPLE_RATE),
                          ("3.12.1", rates.SAMPLE_RATE)):  # the interpreter's own answer, as ask_versions reads it
        monkeypatch.setattr(cluster, "ask_versions", lambda python, user, v=version: lambda: {"python": v})
        assert _default_rate(["pyspy"], False, "/opt/py/bin/python", None, said.append) == rate, version
    assert [s for s in said if "CPython 3.9.18" in s] and [s for s in said if "CPython 3.14.0" in s]


@pytest.mark.parametrize("root,opts,chosen", [
    (True, [], "tap"), (False, [], "comm"), (False, ["--nanny"], "proxy"),
    (False, ["--python", "/opt/py/bin/python"], "proxy"), (False, ["--delay-ms", "5"], "proxy"),
    (True, ["--delay-ms", "5"], "proxy"), (False, ["--server-cmd", "rsds-scheduler --port {port}"], "proxy"),
])
def test_runs_default_records_the_messages_off_their_path_where_it_can(monkeypatch, root, opts, chosen):
    """The tap as root, else the comm tap inside Dask's processes (docs/measurements.md: the proxy's hop costs
    a wake-up and two syscalls per message); the proxy where only it serves: a delay, a server that is not
    Dask's, a nanny (its worker's last records), another interpreter, and a proxy kept there is said."""
    from daskprobe.probes import base
    from daskprobe.probes.registry import WIRE
    from daskprobe.tracer.commands import options
    from daskprobe.tracer.commands.run_verb import _wire
    monkeypatch.setattr(base, "is_root", lambda: root)
    monkeypatch.setattr(base, "native_binary", lambda name: f"/usr/bin/{name}")
    said = []
    got = _wire(options.parse_probes("default"), parser()[0].parse_args(["run", *opts]), said.append)
    assert [w for w in WIRE if w in got] == [chosen]
    assert bool(said) == any(o in opts for o in ("--nanny", "--python"))
