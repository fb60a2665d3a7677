"""Small rule files the command-line tests share."""

MINER_RULE = """
title: Miner process
id: 6a1d2c3b-4e5f-4a6b-8c7d-9e0f1a2b3c4d
status: test
level: critical
logsource: {product: hpc, category: process}
detection:
  sel:
    process.name: xmrig
  condition: sel
"""
