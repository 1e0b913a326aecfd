"""Graders: try one on a sample (`POST /graders/run`) or check it (`POST /graders/validate`)."""
