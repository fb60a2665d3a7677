"""hpcsec detector: context, rules, engine, alerts, outputs, store, command line."""
