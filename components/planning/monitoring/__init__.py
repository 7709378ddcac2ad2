"""Monitoring: Prometheus scrape config and alert rules, Grafana, the engines' serving metrics."""
