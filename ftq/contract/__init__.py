"""The contract every process shares: the spec, statuses, error codes, events, metric points,
the run's progress records, the run directory's layout, and the API's request and response models.
Imports nothing else of ftq."""
