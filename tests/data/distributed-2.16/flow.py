from distributed import Client

def inc(x):
    return x + 1

if __name__ == "__main__":
    with Client() as c:
        c.wait_for_workers(2)
        ws = sorted(c.scheduler_info()["workers"])
        a = c.map(inc, range(10), workers=[ws[0]])
        b = c.map(inc, range(10, 20), workers=[ws[1]])
        total = c.submit(sum, a + b)
        assert total.result() == sum(range(1, 21))
        print("ok", total.result())
