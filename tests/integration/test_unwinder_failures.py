"""Native stacks are named after the run by daskprobe-unwind: when it fails, every sample stays,
its user frames a placeholder that says why (one frame: no separator from its error leaks in); the
files it would not read are in run.json and said."""

from test_decode import make_run
from daskprobe.probes import ebpf_format
from daskprobe.probes.ebpf_tables import NOT_READ, read_cpu
from daskprobe.tracer.decode import tables

FAILING = "#!/bin/sh\nprintf 'bad maps; line\\tthree\\n' >&2\nexit 3\n"


def _failing_unwinder(tmp_path, monkeypatch):
    fake = tmp_path / "daskprobe-unwind"
    fake.write_text(FAILING)
    fake.chmod(0o755)
    monkeypatch.setenv("DASKPROBE_UNWIND", str(fake))  # native_binary looks here first


def _user_frames(cap):
    samples, stacks, frames = read_cpu(cap / "ebpf_cpu.tsv", 0, 0)
    names = frames.set_index("frame_id")
    per_sample = samples.stack_id.map(stacks.set_index("stack_id").frame_ids).map(
        lambda ids: [names.function[i] for i in ids if names.kind[i] == "native"])
    return samples, per_sample


def test_frame_pointer_stacks_keep_their_samples_when_the_symbolizer_fails(tmp_path, monkeypatch):
    _failing_unwinder(tmp_path, monkeypatch)
    cap = tmp_path / "captures"
    cap.mkdir()
    (cap / "ebpf_cpu.tsv").write_text("10\t5\t5\t0\t#7f00,7f10\tschedule\n20\t5\t6\t1\t#7f00\t\n")
    samples, user = _user_frames(cap)
    assert len(samples) == 2
    assert user.tolist() == [["[not symbolized: daskprobe-unwind failed: bad maps line three]"]] * 2


def test_copied_stacks_keep_their_samples_when_the_unwinder_fails(tmp_path, monkeypatch):
    _failing_unwinder(tmp_path, monkeypatch)
    cap = tmp_path / "captures"
    cap.mkdir()
    (cap / "ebpf_ustacks.bin").write_bytes(bytes(2 * ebpf_format.USTACK_SIZE))
    (cap / "ebpf_cpu.tsv").write_text("10\t5\t5\t0\t@0\t\n20\t5\t5\t0\t@1\t\n")
    samples, user = _user_frames(cap)
    assert len(samples) == 2
    assert user.tolist() == [["[not unwound: daskprobe-unwind failed: bad maps line three]"]] * 2


def test_the_files_the_unwinder_did_not_read_are_in_run_json_and_said(tmp_path, monkeypatch, capsys):
    refused = ["/home/u/lib.so: not a regular file",
               "/home/u/zero.so: a symlink (or a file where a directory was) in its path"]
    fake = tmp_path / "daskprobe-unwind"  # names no frame, refuses two files, as daskprobe-unwind says it
    fake.write_text("#!/bin/sh\n" + "".join(f"echo 'daskprobe-unwind: {NOT_READ}{r}' >&2\n" for r in refused)
                    + "echo 'daskprobe-unwind: 2 mapped files not read: 1 not a regular file; 1 a symlink' >&2\n")
    fake.chmod(0o755)
    monkeypatch.setenv("DASKPROBE_UNWIND", str(fake))
    run = make_run(tmp_path, [(1, 0, 0, {"op": "update-graph", "keys": ["x"]})])
    (run / "captures" / "ebpf_cpu.tsv").write_text("10\t10\t10\t0\t#7f00,7f10\t\n")
    tables.build(run)
    assert run.meta()["unread_files"] == refused
    assert "2 mapped files were not read" in capsys.readouterr().err
