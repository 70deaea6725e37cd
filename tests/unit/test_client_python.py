"""The command's interpreter, whose distributed `run` checks against the cluster's."""

import sys

from daskprobe.tracer.capture.session import _client_python


def test_a_python_or_a_script_whose_shebang_names_one_is_found(tmp_path):
    assert _client_python([sys.executable, "-c", "1"]) == sys.executable
    env = tmp_path / "env.py"
    env.write_text("#!/usr/bin/env python3\nprint(1)\n")
    direct = tmp_path / "direct.py"
    direct.write_text(f"#!{sys.executable} -u\nprint(1)\n")
    shell = tmp_path / "run.sh"
    shell.write_text("#!/bin/sh\necho 1\n")
    plain = tmp_path / "plain.py"
    plain.write_text("print(1)\n")
    assert (_client_python([str(env)]) or "").rsplit("/", 1)[-1] == "python3"
    assert _client_python([str(direct), "x"]) == sys.executable
    assert _client_python([str(shell)]) is None and _client_python([str(plain)]) is None
    assert _client_python(["bash", "-c", "true"]) is None and _client_python([str(tmp_path / "none")]) is None
