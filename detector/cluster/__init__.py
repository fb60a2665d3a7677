"""The cluster tier: nodes publish events to NATS JetStream, hubs evaluate them fleet-wide.

streams.py creates the streams and checks the server; partition.py decides which hub member
sees an event; publisher.py is the node side; hub.py and its helpers are the consumer side.
"""
