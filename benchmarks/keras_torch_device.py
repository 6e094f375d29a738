#!/usr/bin/env python
"""Keras' torch backend moves every tensor it converts, even one already on its device: the smallest script that
shows it, for Keras' issue tracker (issue 56 of this project; benchmarks/README.md has the figures).

`keras.ops.convert_to_tensor(x)` (which every `keras.ops` function and every layer call runs on its arguments)
checks `x.device != get_device()`, and `get_device()` is a string ("cpu", "cuda") unless a device scope is set.
A `torch.device` never equals a string, so the check is true for every tensor and an `x.to(device)` is
dispatched each time, a no-op that still goes through torch's dispatcher. The script prints the comparison, the
aten ops one conversion dispatches, and the time of a conversion with the backend's device as Keras keeps it (a
string) and as a `torch.device` (the check then false, nothing dispatched).

    python benchmarks/keras_torch_device.py --calls 20000
"""

import argparse
import json
import os
import time

# the Keras backend it runs on (set before Keras is imported)
BACKEND = "torch"


def _dispatched(fn):
    """The names of the top-level aten ops one call of `fn` dispatches (torch's profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return [e.name for e in prof.events() if e.name.startswith("aten::")
            and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))]


def _per_call_us(fn, calls):
    """Median over 5 rounds of the microseconds one call of `fn` takes, over `calls` calls a round."""
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - start) / calls * 1e6)
    return sorted(rounds)[2]


def measure(calls):
    """{"device": Keras' device, "differs": whether a tensor's device compares unequal to it, then per way the
    backend's device is kept ("string": Keras' default, "torch.device"): the ops one conversion dispatches
    and its microseconds}."""
    os.environ["KERAS_BACKEND"] = BACKEND
    import keras
    import torch
    from keras.src.backend.common import global_state
    from keras.src.backend.torch.core import get_device

    x = torch.ones(4)
    result = {"torch": torch.__version__, "keras": keras.__version__, "device": repr(get_device()),
              "differs": bool(x.device != get_device())}
    convert = lambda: keras.ops.convert_to_tensor(x)  # noqa: E731
    saved = global_state.get_global_attribute("torch_device", None)
    try:
        for way, device in (("string", saved), ("torch.device", torch.device(x.device))):
            global_state.set_global_attribute("torch_device", device)
            result[way] = {"ops": _dispatched(convert), "us_per_call": _per_call_us(convert, calls)}
    finally:
        global_state.set_global_attribute("torch_device", saved)
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000, help="conversions a timing round (default: 20000)")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    result = measure(args.calls)
    print(f"torch {result['torch']}, keras {result['keras']}: the backend's device is {result['device']}; "
          f"a tensor's device != it: {result['differs']}")
    for way in ("string", "torch.device"):
        row = result[way]
        print(f"device kept as a {way:12s}: ops dispatched per convert_to_tensor {row['ops'] or 'none'}, "
              f"{row['us_per_call']:.2f} us a call")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
