"""Version routing: which served version answers a request (pinned, canary weights, sticky keys)
and which one shadows it; the traffic policies that say so, and the admin operations on them."""

# Nothing is imported here: the repository layer imports ``routing.policy`` (a model config's
# traffic policy is checked at load), and importing the router from this package would import
# the repository back. Import from ``routing.router``, ``routing.shadow``, ``routing.policy``.
