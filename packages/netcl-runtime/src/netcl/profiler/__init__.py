"""netcl.profiler: what ran on the device, per kernel (table) and over time (Chrome trace).

The reference's "high-level profiling API", shaped like ``torch.profiler``::

    from netcl.profiler import profile, record_function

    with profile(record_shapes=True) as prof:
        with record_function("step"):
            loss = model(x)
    print(prof.key_averages().table(sort_by="device_time", row_limit=20))
    prof.export_chrome_trace("trace.json")  # open in https://ui.perfetto.dev

``export_chrome_trace(profiles, path)`` and ``key_averages(profiles)`` put several profiles on
one timeline. See ``profile`` for what is recorded and ``docs/profiling.md`` for a walk-through.
"""

from netcl.profiler._events import ProfilerEvent
from netcl.profiler._profile import export_chrome_trace, merged_events, profile, record_function
from netcl.profiler._profile import key_averages_of as key_averages
from netcl.profiler._table import SORT_KEYS, EventList, FunctionEventAvg, format_time

__all__ = [
    "SORT_KEYS",
    "EventList",
    "FunctionEventAvg",
    "ProfilerEvent",
    "export_chrome_trace",
    "format_time",
    "key_averages",
    "merged_events",
    "profile",
    "record_function",
]
