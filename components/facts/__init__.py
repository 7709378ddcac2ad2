"""Hardware and model facts: the one table read by the components, the planner and the policy pack."""
