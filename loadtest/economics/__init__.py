"""Token economics: the hardware and price behind an endpoint, and what a token costs at each load point."""
