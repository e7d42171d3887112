"""What moves Jobs toward their spec: controllers (level-triggered, idempotent) and their pure parts.

- `attempt_machine.py`, `attempts.py`: the Attempt state machine (pure): phases, legal moves, how agent
  reports fold into status; `reasons.py`: the one typed vocabulary of reasons, read from common.proto.
- `views.py`: the typed, frozen Job and Attempt views the decisions read (decoded once by the cache).
- `job.py`: the Job controller's decision (pure): (Job, Attempts, now) → status and actions;
  `recovery.py` its checkpoint, storage and suspend parts; `gang.py`, `gang_plan.py` the gang's.
- `checkpoints.py`: the checkpoint rules (fencing, completeness, cadence, retention), pure.
- `job_controller.py`: performs those decisions, driven by the cache, wake-ups and a resync.
- `placement.py`: performs `scheduler.place_all` for waiting attempts.
- `lease.py`: expired node leases → NotReady nodes and Lost attempts.
- `assignment.py`: an Attempt and its Job compiled into the wire Assignment.
- `cache.py`, `objects.py`, `workqueue.py`: the watch-fed view of the store, CAS writes, the work queue.
- `plane.py`: wires them together for `main.py`.

See docs/adr/0009-controllers.md for why they are shaped this way.
"""
