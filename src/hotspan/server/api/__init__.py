"""hotspan's own APIs: agent settings, alerts, recording rules, tokens, scrape targets,
endpoints, why a span is slow, /metrics."""
