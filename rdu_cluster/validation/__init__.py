"""Published cases and measurements beside the simulated figures."""
