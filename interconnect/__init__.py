"""Inter-socket networks: topologies, links, routes, collectives and contention."""
