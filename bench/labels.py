"""What a benchmark run is labelled, checked against what the storage server saw.

A run labelled a *first* copy or load (section fig11, an sw-pool method) must have read the data from
shared storage; a run labelled a *repeat* (fig11-repeat) must have read (almost) nothing. A run whose
storage bytes (the storage server NIC's counter around the run) contradict its label measured
something else, e.g. a "first load" that found the pool already cached on every node: report.py
refuses to compute any figure from it and lists it.
"""

FIRST = ("swpool-cp", "swpool-load-sqfs", "swpool-load-ext2")


def check(run, data_bytes):
    """None when `run`'s storage bytes fit its label, else why not."""
    sb = run.get("storage_bytes")
    if sb is None or not data_bytes:
        return None
    if run.get("section") == "fig11" and run.get("method") in FIRST and sb < 0.9 * data_bytes:
        return (f"labelled a first `{run['method']}` at N={run.get('n')} (rep {run.get('rep')}), but storage served "
                f"{sb:,} B of the {data_bytes:,}-byte data: it found the data already on the nodes")
    if run.get("section") == "fig11-repeat" and sb > 0.01 * data_bytes:
        return (f"labelled a repeat `{run.get('method')}` at N={run.get('n')}, but storage served {sb:,} B "
                f"(over 1 % of the {data_bytes:,}-byte data): it did not find the data on the nodes")
    return None
