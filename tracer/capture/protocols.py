"""The comms a cluster daskprobe starts may use (run --protocol): here alone, for the CLI to list them
without importing the cluster's code. The proxy and the tap read tcp:// only; the others' messages are
the comm tap's (probes/comm_tap.py): tls (encrypted, with a certificate made for the run), ws (Tornado's
websockets)."""

PROTOCOLS = ("tcp", "tls", "ws")
