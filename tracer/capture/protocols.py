"""The comms a cluster daskprobe starts may use (run --protocol): here alone, for the CLI to list them
without importing the cluster's code. The proxy and the tap read tcp:// only; the others' messages are
the comm tap's (probes/comm_tap.py): tls (encrypted, with a certificate made for the run), ws (Tornado's
websockets), ucx (distributed-ucxx, in the cluster's Python: see PRIVATE_NETWORK)."""

PROTOCOLS = ("tcp", "tls", "ws", "ucx")
# UCX's listener binds every interface (ucxx takes no address) and a UCX endpoint carries nothing the peer
# guard could check: its cluster and the command run in a network namespace of their own, loopback only.
PRIVATE_NETWORK = {"ucx"}
