"""Every test: a key of run.json or summary.json that its definition lacks, or whose value is of
another type, is raised (probes/json_schema.py), in the test's process and in the daskprobe
processes it starts (they inherit the environment). A user's run says it and goes on."""

import os

os.environ["DASKPROBE_STRICT"] = "1"
