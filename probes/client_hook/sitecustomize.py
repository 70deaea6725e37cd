"""daskprobe's client hook, loaded by the Python of the command `daskprobe run` runs: this directory is
first on the command's PYTHONPATH, so Python's site module imports this file at start-up. It installs
the features below (daskprobe_hook.py says how they work), then runs the sitecustomize this one
hides, if the path has another (a distribution's, a virtualenv's), as Python would have.

FEATURES is the registration point: add a feature by adding its module (daskprobe_hook_NAME.py, in
this directory) here. Standard library only at start-up.
"""

FEATURES = (
    "daskprobe_hook_own_cluster",  # a command's own LocalCluster or Client(n_workers=...): daskprobe's cluster
    "daskprobe_hook_local_scheduler",  # Dask's local schedulers (threads, processes, sync): their jobs recorded
)


def _install() -> None:
    try:
        import daskprobe_hook
    except Exception as e:  # noqa: BLE001 - the user's command must run whatever happens here
        import sys
        print(f"daskprobe: client hook not loaded ({type(e).__name__}: {e})", file=sys.stderr)
        return
    daskprobe_hook.install(FEATURES)


def _chain() -> None:
    """The next sitecustomize on the path, run as Python would have run it (its errors reach the
    site module, which prints them and goes on, as without us)."""
    import os
    import sys
    from importlib._bootstrap import module_from_spec  # importlib.util's, without its import of threading
    from importlib.machinery import PathFinder
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_install()
_chain()
