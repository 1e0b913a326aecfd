"""A run's artifacts: the list (with cached sha256), one file (Range, ETag), a folder as a tar stream."""
