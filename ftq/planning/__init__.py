"""The planning arithmetic: a spec's render, memory and disk estimate, time estimate and dataset
preflight. Pure functions of the spec, the settings and the files the spec names."""
