"""The recorder's side of the per-host agents, without a cluster: which member gets which pid,
and what an answer may make it write."""

import json

from daskprobe.probes.rundir import RunDir
from daskprobe.tracer.agents import Agents
from daskprobe.tracer.attached import Attached, AttachSpec
from daskprobe.tracer.cluster import Member


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


class Answers(Agents):
    """Agents whose one host answers as given: what a worker's client.run would return."""

    def __init__(self, state: dict, data: bytes):
        self.run_id, self.seen, self.offsets, self.state, self.data = "r", {}, {}, state, data

    def hosts(self):
        return {"10.0.0.2": ("tcp://10.0.0.2:4001", False)}

    def _on(self, member, fn, *args):
        if fn.__name__ == "monotonic_ns":
            return 5
        verb = args[1]
        if verb == "read":
            return self.data[int(args[3]):][:3]
        return {"state": json.dumps(self.state).encode(), "stop": json.dumps(self.state).encode(), "done": b"ok",
                "ports": b"ok"}[verb]


def test_pulls_append_what_is_new_and_write_nothing_outside_the_hosts_capture_folder(tmp_path):
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    state = {"info": {"members": []}, "files": {"captures/pyspy.tsv": 4, "../../../escaped": 4, "captures/../x": 4}}
    agents = Answers(state, b"abcdefgh")
    agents.pull(run, {4001: "worker-0"})
    agents.state["files"]["captures/pyspy.tsv"] = 8
    agents.pull(run, {4001: "worker-0"}, final=True)  # read in 3-byte chunks here: the rest, once
    assert (run / "hosts" / "10.0.0.2" / "captures" / "pyspy.tsv").read_bytes() == b"abcdefgh"
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["pyspy.tsv"]
    assert agents.seen["10.0.0.2"]["complete"] and "error" not in agents.seen["10.0.0.2"]


def test_a_host_whose_last_member_left_keeps_what_was_read_and_says_so(tmp_path):
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    agents = Answers({"info": {"members": [{"name": "tcp://10.0.0.2:4001", "pid": 7}]}, "files": {}}, b"")
    agents.pull(run, {})  # read once, with nothing captured yet: no folder of its own so far
    agents.hosts = lambda: {}  # then its last worker left
    hosts = agents.finish(run, {})
    assert hosts["10.0.0.2"]["complete"] is False and "no member" in hosts["10.0.0.2"]["error"]
    assert json.loads((run / "hosts" / "10.0.0.2" / "agent.json").read_text())["members"][0]["pid"] == 7


def test_a_scheduler_gone_before_the_last_read_keeps_every_host_read_so_far(tmp_path):
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    agents = Answers({"info": {"members": [{"name": "tcp://10.0.0.2:4001", "pid": 7}]},
                      "files": {"captures/pyspy.tsv": 4}}, b"abcd")
    agents.pull(run, {})

    def gone():
        raise OSError("Timed out trying to connect")
    agents.hosts = gone
    hosts = agents.finish(run, {})
    assert hosts["10.0.0.2"]["complete"] is False and "scheduler did not answer" in hosts["10.0.0.2"]["error"]
    assert (run / "hosts" / "10.0.0.2" / "captures" / "pyspy.tsv").read_bytes() == b"abcd"
