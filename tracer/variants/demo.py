"""The built-in demo workload: `daskprobe run` with no command runs this.

1,000 small tasks spread over the workers, then one sum that must fetch
inputs from every worker (worker-to-worker transfers), checked at the end.
"""

import sys

from distributed import Client


def inc(x):
    return x + 1


def main(n: int = 1000) -> int:
    with Client() as client:
        parts = client.map(inc, range(n))
        total = client.submit(sum, parts).result()
    expected = sum(range(1, n + 1))
    print(f"demo: sum of {n} incremented values = {total} (expected {expected})")
    return 0 if total == expected else 1


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000))
