"""Gateway replicas on one Redis: each publishes its stats windows and reads the others'
(report.py, fleet.py), and a policy reload on one is applied by all (sync.py)."""

from gateway.replicas.fleet import Fleet
from gateway.replicas.report import ReplicaReport, replica_id
from gateway.replicas.sync import FleetStats, ReplicaSync

__all__ = ["Fleet", "FleetStats", "ReplicaReport", "ReplicaSync", "replica_id"]
