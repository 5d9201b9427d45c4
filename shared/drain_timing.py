"""How long the gateway's stop takes past its drain: the launcher sizes its stop timeout by it, the gateway's
server cuts by it (services/gateway/http/drain.py)."""

CUT_GRACE_S = 5.0  # after the drain's cut: time for the error events to reach their clients
