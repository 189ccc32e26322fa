"""Chapter 11: a planner that carries the checked formulas to a real cluster."""
