"""Alert outputs: stdout, JSONL file, syslog, webhook; the durable spool in front."""
