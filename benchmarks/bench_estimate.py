"""Benchmark ``Localizer.estimate``: predicted against measured seconds and peak memory, every localizer.

    python benchmarks/bench_estimate.py --model gemma3 smollm2 --threads 1
    python benchmarks/bench_estimate.py --model smollm2 --only kn dcsn --threads 1

For each model and localizer: ``estimate(data)`` (its probe is timed apart, once per model), then
``fit(data)`` timed, with the process's resident memory sampled every 5 ms during the fit. The
table gives predicted and measured seconds and their ratio (measured / predicted), and the
predicted working set against the measured rise of resident memory during the fit (on a GPU:
``torch.cuda.max_memory_allocated`` against the predicted peak). Small data: dataset methods get
``--n`` arithmetic problems, fact methods the first ``--facts`` builtin facts the model knows
(KN / SIG / AMIG take them as the prompts of one fact; Query Localization as two-query facts).
"""

from __future__ import annotations

import argparse
import os
import threading
import time
import warnings


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """Peak resident bytes above the level at entry, sampled in a thread."""

    def __enter__(self):
        self.base = self.peak = rss()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, rss())
        self.rise = self.peak - self.base


def data_for(name: str, model, args):
    import capinterp as ci
    from capinterp.data.facts import builtin_facts, facts_known_by

    known = facts_known_by(model, builtin_facts())
    if name in ("cnl", "dcsn", "neft"):
        return ci.data.arithmetic("+", n=args.n, seed=0)
    if name == "query_localization":  # one fact, two queries (the prompt and a prefixed paraphrase)
        k = known[0]
        return [[k, ci.Example("In short, " + k.prompt, k.target)]]
    if name in ("kn", "amig"):
        return known[: args.facts]
    if name == "sig":
        return known[:1]
    return known[: args.facts]


def make(name: str, model):
    from capinterp.localizers import QueryLocalization, get

    if name == "query_localization":
        return QueryLocalization(model, "kn", progress=False)
    cls = get(name)
    params = dict(cls.check_params) if name == "amig" else {}
    return cls(model, progress=False, **params)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", nargs="+", default=["gemma3", "smollm2"], help="packaged model names (default: both)")
    ap.add_argument(
        "--only", nargs="*", default=None, help="localizer names (default: every registered one + query_localization)"
    )
    ap.add_argument("--n", type=int, default=4, help="arithmetic problems for dataset-level methods (4)")
    ap.add_argument("--facts", type=int, default=2, help="builtin facts for fact-level methods (2; SIG: 1)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default=None)
    args = ap.parse_args()

    import torch

    from capinterp.arch.model import load_model
    from capinterp.localizers import available
    from capinterp.localizers.cost import probe

    names = args.only or [*available(), "query_localization"]
    rows = []
    print(
        "| model | method | data | predicted s | measured s | measured / predicted | predicted working set | measured rise | passes |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for model_name in args.model:
        model = load_model(model_name, threads=args.threads, device=args.device)
        cuda = torch.device(model.cfg.device).type == "cuda"
        t = time.perf_counter()
        pr = probe(model)
        print(f"<!-- {model_name}: probe {time.perf_counter() - t:.2f} s, {pr} -->", flush=True)
        for name in names:
            loc = make(name, model)
            data = data_for(name, model, args)
            est = loc.estimate(data)
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            with warnings.catch_warnings(), PeakRSS() as mem:
                warnings.simplefilter("ignore")
                t = time.perf_counter()
                loc.fit(data)
                if cuda:
                    torch.cuda.synchronize()
                secs = time.perf_counter() - t
            measured_mem = torch.cuda.max_memory_allocated() if cuda else mem.rise
            predicted_mem = est.peak_bytes if cuda else est.working_bytes
            n = len(data)
            row = (
                f"| {model_name} | {name} | {n} | {est.seconds:.1f} | {secs:.1f} | {secs / est.seconds:.2f} | "
                f"{predicted_mem / 1e6:.0f} MB | {measured_mem / 1e6:.0f} MB | {est.passes} |"
            )
            rows.append(row)
            print(row, flush=True)
        del model


if __name__ == "__main__":
    main()
