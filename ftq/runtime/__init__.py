"""Settings and the helpers the server's processes share: logging, masking, the broker, the
user's files under the data dir, the operator's limits."""
