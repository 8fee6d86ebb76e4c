"""Reports: the only layer that formats numbers (through trainplan.units)."""
