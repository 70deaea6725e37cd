"""The recorder's side of the per-host agents, without a cluster: which member gets which pid,
and what an answer may make it write."""

import json
from pathlib import Path

from daskprobe.probes.rundir import RunDir
from daskprobe.tracer.capture.agents import Agents
from daskprobe.tracer.capture.attached import Attached, AttachSpec
from daskprobe.tracer.capture.cluster import Member


def test_a_restart_at_a_fixed_port_gives_each_process_its_own_pid(tmp_path):
    attached = Attached(AttachSpec("tcp://10.0.0.1:8786"), RunDir(tmp_path))
    attached.members = [Member("worker-0", "worker", "10.0.0.2:4001", "10.0.0.2:4001"),
                        Member("worker-1", "worker", "10.0.0.2:4002", "10.0.0.2:4002"),  # left, and came back as 3
                        Member("worker-3", "worker", "10.0.0.2:4002", "10.0.0.2:4002")]
    rows = [{"name": "tcp://10.0.0.2:4002", "pid": 70}, {"name": "tcp://10.0.0.2:4001", "pid": 71},
            {"name": "tcp://10.0.0.2:4002", "pid": 95}]  # as they joined the agent
    assert attached._give_pids(rows, 2**22, 0) == []
    assert [m.pid for m in attached.members] == [2**22 + 71, 2**22 + 70, 2**22 + 95]


def test_a_worker_that_came_and_went_between_two_looks_is_a_member_of_its_own(tmp_path):
    attached = Attached(AttachSpec("tcp://10.0.0.1:8786"), RunDir(tmp_path))
    attached.members = [Member("scheduler", "scheduler", "10.0.0.1:8786", "10.0.0.1:8786"),
                        Member("worker-0", "worker", "10.0.0.2:4001", "10.0.0.2:4001")]
    rows = [{"name": "tcp://10.0.0.2:4001", "role": "worker", "pid": 71, "joined_ns": 100},
            {"name": "tcp://10.0.0.2:4009", "role": "worker", "pid": 80, "joined_ns": 500},  # never listed to us
            {"name": "tcp://10.0.0.2:4009", "role": "worker", "pid": 81, "joined_ns": 900}]  # nor its restart
    unseen = attached._give_pids(rows, 2**22, 1_000)
    assert [(m.name, m.listen, m.pid, m.found_ns, m.left_ns, m.machine) for m in unseen] == [
        ("worker-1", "10.0.0.2:4009", 2**22 + 80, 1_500, 1_900, "10.0.0.2"),
        ("worker-2", "10.0.0.2:4009", 2**22 + 81, 1_900, None, "10.0.0.2")]
    assert attached.members[1].pid == 2**22 + 71


class Relay:
    def poll(self):
        return None


class Answers(Agents):
    """Agents whose one host answers as given: what the relay would hand over from a worker's client.run."""

    def __init__(self, state: dict, data: bytes):
        self.run_id, self.seen, self.offsets, self.state, self.data = "r", {}, {}, state, data
        self.relay, self.log, self.here = Relay(), None, set()

    def hosts(self):
        return {"10.0.0.2": ("tcp://10.0.0.2:4001", False)}

    def _request(self, do, **fields):
        if do == "clock":
            return {"clock": [[1, 5, 3]]}, b""
        words = fields["words"]
        if words[0] == "read":
            return {}, self.data[int(words[2]):][:3]
        return {}, {"state": json.dumps(self.state).encode(), "stop": json.dumps(self.state).encode(), "done": b"ok",
                    "ports": b"ok"}[words[0]]


def answers(tmp_path, state: dict, data: bytes) -> tuple[RunDir, Answers]:
    run = RunDir(tmp_path / "run")
    (run.path / "logs").mkdir(parents=True)
    agents = Answers(state, data)
    agents.log = run.log("agents")
    return run, agents


WORKER = {"name": "tcp://10.0.0.2:4001", "role": "worker", "pid": 7}


def test_pulls_append_what_is_new_and_write_nothing_outside_the_hosts_capture_folder(tmp_path):
    state = {"info": {"members": []}, "files": {"captures/pyspy.tsv": 4, "../../../escaped": 4, "captures/../x": 4}}
    run, agents = answers(tmp_path, state, b"abcdefgh")
    agents.pull(run, {4001: "worker-0"})  # refused whole (twice: two tries): counted, nothing written
    assert agents.seen["10.0.0.2"]["bad_replies"] == 2 and not (run / "hosts").exists()
    agents.state["files"] = {"captures/pyspy.tsv": 4}
    agents.pull(run, {4001: "worker-0"})
    agents.state["files"]["captures/pyspy.tsv"] = 8
    agents.pull(run, {4001: "worker-0"}, final=True)  # read in 3-byte chunks here: the rest, once
    assert (run / "hosts" / "10.0.0.2" / "captures" / "pyspy.tsv").read_bytes() == b"abcdefgh"
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["agents.log", "pyspy.tsv"]
    assert agents.seen["10.0.0.2"]["complete"] and "error" not in agents.seen["10.0.0.2"]


def test_a_host_whose_last_member_left_keeps_what_was_read_and_says_so(tmp_path):
    run, agents = answers(tmp_path, {"info": {"members": [WORKER]}, "files": {}}, b"")
    agents.pull(run, {})  # read once, with nothing captured yet: no folder of its own so far
    agents.hosts = lambda: {}  # then its last worker left
    hosts = agents.finish(run, {})
    assert hosts["10.0.0.2"]["complete"] is False and "no member" in hosts["10.0.0.2"]["error"]
    assert json.loads((run / "hosts" / "10.0.0.2" / "agent.json").read_text())["members"][0]["pid"] == 7


def test_a_scheduler_gone_before_the_last_read_keeps_every_host_read_so_far(tmp_path):
    run, agents = answers(tmp_path, {"info": {"members": [WORKER]}, "files": {"captures/pyspy.tsv": 4}}, b"abcd")
    agents.pull(run, {})

    def gone():
        raise OSError("Timed out trying to connect")
    agents.hosts = gone
    hosts = agents.finish(run, {})
    assert hosts["10.0.0.2"]["complete"] is False and "scheduler did not answer" in hosts["10.0.0.2"]["error"]
    assert (run / "hosts" / "10.0.0.2" / "captures" / "pyspy.tsv").read_bytes() == b"abcd"


def test_a_bad_reply_is_counted_and_the_host_read_again_at_the_next_pull(tmp_path):
    bad = dict(WORKER, pid="7")  # a pid that is not a number: the sum with the host's base once raised
    run, agents = answers(tmp_path, {"info": {"members": [bad]}, "files": {"captures/pyspy.tsv": 4}}, b"abcd")
    agents.pull(run, {})
    seen = agents.seen["10.0.0.2"]
    assert seen["bad_replies"] == 2 and "pid" in seen["error"] and not (run / "hosts").exists()  # tried twice
    assert "a bad reply from 10.0.0.2" in run.log("agents").read_text()
    for bad in ({**WORKER, "pid": 1 << 22}, {**WORKER, "name": "tcp://10.0.0.2:4001/../x"}, {**WORKER, "role": 1}):
        agents.state["info"]["members"] = [bad]
        agents.pull(run, {})
    assert seen["bad_replies"] == 5
    agents.state["info"]["members"] = [WORKER]
    hosts = agents.finish(run, {})
    assert hosts["10.0.0.2"]["complete"] and hosts["10.0.0.2"]["members"][0]["pid"] == 7
    assert (run / "hosts" / "10.0.0.2" / "captures" / "pyspy.tsv").read_bytes() == b"abcd"


def test_a_read_that_fails_midway_is_taken_up_where_it_stopped_and_renews_the_lease(tmp_path):
    run, agents = answers(tmp_path, {"info": {"members": [WORKER]}, "files": {"captures/pyspy.tsv": 8}}, b"abcdefgh")
    asked, failed = [], []
    answer = agents._request

    def flaky(do, **fields):
        asked.append(fields.get("words", [do])[0])
        if fields.get("words", [""])[0] == "read" and fields["words"][2] == "3" and len(failed) < 2:
            failed.append(1)  # the second chunk fails twice: this pull's tries
            raise OSError("the worker's comm broke")
        return answer(do, **fields)
    agents._request = flaky
    agents.pull(run, {})
    assert "OSError" in agents.seen["10.0.0.2"]["error"]
    asked.clear()
    agents.pull(run, {})  # the next pull asks again (an agent not asked for LEASE_S would end)
    assert "state" in asked and "error" not in agents.seen["10.0.0.2"]
    hosts = agents.finish(run, {})
    assert (run / "hosts" / "10.0.0.2" / "captures" / "pyspy.tsv").read_bytes() == b"abcdefgh"  # nothing twice
    assert hosts["10.0.0.2"]["complete"] and hosts["10.0.0.2"]["failed_reads"] == 2


def test_a_chunk_past_its_cap_is_refused_and_a_host_past_its_cap_is_read_no_further(tmp_path, monkeypatch):
    from daskprobe.tracer.capture import agents as agents_module
    run, agents = answers(tmp_path, {"info": {"members": [WORKER]}, "files": {"captures/pyspy.tsv": 8}}, b"abcdefgh")
    monkeypatch.setattr(agents_module, "CHUNK", 2)
    agents.pull(run, {})
    assert agents.seen["10.0.0.2"]["bad_replies"] == 2 and "chunk of 3 bytes" in agents.seen["10.0.0.2"]["error"]
    monkeypatch.setattr(agents_module, "CHUNK", 3)
    monkeypatch.setattr(agents_module, "HOST_BYTES", 5)
    hosts = agents.finish(run, {})
    assert (run / "hosts" / "10.0.0.2" / "captures" / "pyspy.tsv").read_bytes() == b"abcdef"  # up to the cap
    assert hosts["10.0.0.2"]["complete"] is False and "passed" in hosts["10.0.0.2"]["error"]


def test_collecting_a_host_that_sent_a_bad_pid_keeps_the_run_and_makes_it_partial(tmp_path):
    run, agents = answers(tmp_path, {"info": {"members": [dict(WORKER, pid="7")]}, "files": {}}, b"")
    (run.path / "run.json").write_text("{}")
    attached = Attached(AttachSpec("tcp://10.0.0.1:8786"), run)
    attached.members = [Member("worker-0", "worker", "10.0.0.2:4001", "10.0.0.2:4001")]
    attached.agents = agents
    agents.pull(run, {})
    agents.close = lambda: None
    said = attached.collect_agents()
    meta = run.meta()
    assert meta["partial"] and "pid" in meta["probe_errors"]["agent@10.0.0.2"], meta
    assert "10.0.0.2" in said and attached.members[0].pid is None


def serve_briefly(tmp_path, monkeypatch, verbs: list[str]) -> Path:
    """An Agent with no probes serving a listener for a lease of 0.2 s, asked `verbs` first; its directory."""
    import socket
    import threading
    import uuid
    from daskprobe.probes import agent as agent_module
    monkeypatch.setattr(agent_module, "LEASE_S", 0.2)
    agent = agent_module.Agent.__new__(agent_module.Agent)
    agent.dir = tmp_path / "agent"
    (agent.dir / "captures").mkdir(parents=True)
    (agent.dir / "captures" / "pyspy.tsv").write_bytes(b"captured")
    agent.run, agent.members, agent.skipped, agent.probes, agent.stopped = None, [], {}, [], False
    agent.tap, agent.tapped = None, {}
    run_id = uuid.uuid4().hex[:12]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(agent_module._name(run_id))
    listener.listen(4)
    serving = threading.Thread(target=agent.serve, args=(listener,))
    serving.start()
    for verb in verbs:
        agent_module.ask(run_id, verb)
    serving.join(10)
    listener.close()
    assert not serving.is_alive()
    return agent.dir


def test_an_agent_whose_lease_lapsed_keeps_its_captures_and_one_told_done_removes_them(tmp_path, monkeypatch):
    kept = serve_briefly(tmp_path / "lapsed", monkeypatch, ["state"])  # read once, then nobody asked
    assert (kept / "captures" / "pyspy.tsv").read_bytes() == b"captured", "a host cut off keeps its captures"
    assert not serve_briefly(tmp_path / "done", monkeypatch, ["state", "done"]).exists()
