"""Nanny preload (loaded by file path, so any interpreter can use it): make the
nanny advertise the proxy's address, as `--contact-address` does for workers."""

import os


def dask_setup(nanny):
    nanny._address = os.environ["DASKPROBE_NANNY_CONTACT"]
