"""What a replica tells the others about itself: its stats windows, as counter samples.

Each window is the live counters minus the snapshot the window starts from (the same
differences /admin/stats takes), so a fleet's window is the plain sum of its replicas'.
"""

import json
import os
import socket
from dataclasses import dataclass
from typing import Any

from gateway.stats.counters import Samples

Windows = dict[str, tuple[float, Samples]]  # window name -> (seconds covered, samples)


def replica_id() -> str:
    """TIERGATE_REPLICA_ID, else host:pid (unique on one machine and across pods)."""
    return os.environ.get("TIERGATE_REPLICA_ID") or f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class ReplicaReport:
    replica: str
    at: float  # unix time the windows were read
    started_at: float
    windows: Windows

    def to_json(self) -> str:
        windows = {
            name: {"seconds": seconds, "samples": _encode(samples)}
            for name, (seconds, samples) in self.windows.items()
        }
        body = {"replica": self.replica, "at": self.at, "started_at": self.started_at}
        return json.dumps({**body, "windows": windows}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> "ReplicaReport":
        data = json.loads(text)
        windows = {
            name: (float(w["seconds"]), _decode(w["samples"]))
            for name, w in data["windows"].items()
        }
        return cls(str(data["replica"]), float(data["at"]), float(data["started_at"]), windows)


def _encode(samples: Samples) -> dict[str, list[Any]]:
    # Zeros are left out: most label sets saw nothing in the last minute.
    return {
        name: [[list(map(list, labels)), value] for labels, value in values.items() if value]
        for name, values in samples.items()
    }


def _decode(data: dict[str, list[Any]]) -> Samples:
    return {
        name: {tuple((str(k), str(v)) for k, v in labels): float(value) for labels, value in rows}
        for name, rows in data.items()
    }


def summed(reports: list[ReplicaReport]) -> Windows:
    """The fleet's windows: samples added label set by label set; a window covers the
    longest span any replica's does."""
    out: Windows = {}
    for report in reports:
        for name, (seconds, samples) in report.windows.items():
            span, total = out.get(name, (0.0, {}))
            for sample, values in samples.items():
                into = total.setdefault(sample, {})
                for labels, value in values.items():
                    into[labels] = into.get(labels, 0.0) + value
            out[name] = (max(span, seconds), total)
    return out
